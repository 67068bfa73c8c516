"""The Trainer's less common settings, as small frozen dataclasses."""

from __future__ import annotations

import datetime
import functools
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..errors import SettingError
from ..stack import outside
from .determinism import check_deterministic
from .ema import check_decay
from .limits import check_limit
from .ported import ported
from .sanity import check_sanity
from .schedule import check_floor, check_schedule
from .settings import choice, count, positive
from .smoke import check_smoke
from .stopping import check_stop_on
from .timelimit import check_max_time

__all__ = ["PRECISIONS", "Options", "check_device"]

PRECISIONS = ("32", "bf16", "fp16")


@dataclass(frozen=True)
class Options:
    """The Trainer's less common settings.

    Args:
        device: where to train (default: where the model's parameters are; under
            torchrun with CUDA, this rank's GPU).
        precision: ``"32"``; ``"bf16"`` for bfloat16 autocast; ``"fp16"`` for float16
            autocast with a gradient scaler (``torch.amp.GradScaler``, checkpointed).
        clip_grad_norm: clip the gradients' total norm to this value before each step.
        clip_grad_value: clamp each gradient element to ``[-v, v]`` before each step
            (``nn.utils.clip_grad_value_``; Lightning's ``gradient_clip_algorithm="value"``).
            Like ``clip_grad_norm``, once per step on the gradient it uses: after every
            micro-batch and accumulated batch, all-reduced under DDP, unscaled under fp16.
            Not with ``clip_grad_norm``: a run clips one way, as in Lightning.
        log_grad_norm: tell watchers each step's gradient norm (``StepEnd.grad_norm``,
            TensorBoard's ``train/grad_norm``) without clipping by norm, which tells it
            anyway: one more pass over the gradients a step, and a read-back, only when
            the run has watchers (Lightning's ``grad_norm`` in ``on_before_optimizer_step``).
        shuffle: permute a sequence of batches every epoch (seeded by ``(seed, epoch)``).
        eval_every_steps: evaluate every N optimizer steps instead of at each epoch end.
        eval_every_epochs: evaluate at the end of every N-th epoch only (Lightning's
            ``check_val_every_n_epoch``): epochs N, 2N... Not with ``eval_every_steps``.
        min_epochs: a pruner cannot stop the run before this many epochs have ended: a
            "stop" earlier is not acted on, and the pruner is asked again at the next
            evaluation (Lightning's ``min_epochs``). ``epochs`` still ends the run.
        min_steps: the same, counted in optimizer steps (``max_steps`` still ends the run).
        smoke: a smoke run (Lightning's ``fast_dev_run``): ``fit`` trains one epoch of N
            batches (True: 1), evaluates N batches of ``val`` once, writes no checkpoint,
            tells no watcher, returns the result and puts the model's weights and the RNG
            states back; ``evaluate`` and ``predict`` read N batches.
        sanity_val_batches: before a fresh run's first step, evaluate this many batches of
            ``val`` once (Lightning's ``num_sanity_val_steps``, 2 there too), so a broken
            validation fails at once; it changes nothing the run computes (RNG states put
            back, nothing recorded or reported) and is skipped where it could (see
            ``sanity.py``). 0 turns it off.
        monitor: the metric ``TrainResult.best`` tracks (and pruners without a ``metric``).
        mode: ``"min"`` or ``"max"`` — which way ``monitor`` improves.
        progress: show a progress bar; None: when standard error is a terminal or a
            Jupyter notebook's output.
        scheduler_every: step the LR scheduler every ``"step"`` or every ``"epoch"``.
        compile: train through ``torch.compile`` — True, or its keyword arguments
            (``{"fullgraph": True, "mode": "max-autotune"}``). Nodes still see each step's
            number as ``ctx.step``, without a recompile per step. A module the caller
            compiled (``torch.compile(module(g))`` or ``module(g).compile()``) gets the same.
        accumulate: accumulate the gradients of this many batches into each optimizer
            step — exactly one batch as large for a mean loss (each batch weighs by its
            size); under DDP gradients are all-reduced once per step.
        nonfinite: what a NaN or infinite loss does — ``"raise"`` a ``NonFiniteError``
            naming the step, epoch and batch before the optimizer steps (so no non-finite
            weights are ever checkpointed); ``"skip"`` the step (counted in
            ``TrainResult.skipped``); ``"ignore"``: step anyway. ``"raise"`` and ``"skip"``
            read the loss back every step (a device synchronisation on a GPU).
        limit_train_batches: train each epoch on at most this many batches (an int), or on
            this fraction of them (a float in (0, 1]: ``int(len(train) * fraction)``) —
            Lightning's ``limit_train_batches``; the first of each epoch's order. None: all.
        limit_val_batches: evaluate on at most this many batches of ``val`` (an int), or on
            this fraction of them (a float in (0, 1]). None: all. ``evaluate()`` reads all
            the data it is given.
        ema: keep an exponential moving average of the weights with this decay (0.999:
            about the last 1,000 steps), by torch's ``get_ema_multi_avg_fn`` after every
            optimizer step; evaluation runs on it and the model holds it when ``fit``
            returns (Lightning's ``EMAWeightAveraging``). Checkpointed. See ``ema.py``.
        max_time: a budget of training time (Lightning's ``max_time``): seconds, a
            ``datetime.timedelta`` or ``"DD:HH:MM:SS"``. Checked after each step; once
            spent, the run stops there as at ``max_steps`` (checkpointed, with
            ``TrainResult.timed_out`` True). It counts across resumes. See ``timelimit.py``.
        deterministic: torch's deterministic algorithms during ``fit`` (Lightning's
            ``deterministic``): True (an operation without a deterministic implementation
            raises; cuDNN deterministic, no autotuning), ``"warn"``, False, or None to
            leave torch's settings as they are. Put back when ``fit`` ends. See
            ``determinism.py``.
        find_unused_parameters: under DDP, let parameters get no gradient in a step —
            a node a step does not run, a module a node holds but does not call
            (``DistributedDataParallel``'s ``find_unused_parameters``; Lightning's
            ``strategy="ddp_find_unused_parameters_true"``). It costs a walk of the
            autograd graph each step, so it is off by default; without it such a model
            fails at its second step, with a note naming this setting.
        stop_on: stop cleanly on a signal, for a preempted job (Lightning's SIGTERM
            handling): a signal (``signal.SIGTERM``), its name (``"SIGTERM"``) or a tuple
            of them (``("SIGTERM", "SIGUSR1")``, SLURM's ``--signal=USR1@90``). During
            ``fit`` (from the main thread) a handler notes the signal; the run stops at the
            end of the step under way, as at ``max_time``, writes its checkpoint (with
            ``checkpoint=``: ``fit(resume="last")`` goes on bitwise), tells its watchers,
            puts the previous handlers back and raises ``SystemExit(128 + signum)`` (143
            for SIGTERM). Under DDP every rank stops at the same step. None: nothing is
            installed. See ``stopping.py``.
    """

    device: str | torch.device | None = None
    precision: Literal["32", "bf16", "fp16"] = "32"
    clip_grad_norm: float | None = None
    shuffle: bool = True
    eval_every_steps: int | None = None
    monitor: str = "val_loss"
    mode: Literal["min", "max"] = "min"
    progress: bool | None = None
    scheduler_every: Literal["step", "epoch"] = "step"
    nonfinite: Literal["raise", "skip", "ignore"] = "raise"
    accumulate: int = 1
    compile: bool | Mapping[str, Any] = False
    limit_train_batches: int | float | None = None
    limit_val_batches: int | float | None = None
    eval_every_epochs: int | None = None
    min_epochs: int | None = None
    min_steps: int | None = None
    smoke: bool | int = False
    sanity_val_batches: int = 2
    ema: float | None = None
    max_time: float | datetime.timedelta | str | None = None
    deterministic: bool | Literal["warn"] | None = None
    find_unused_parameters: bool = False
    clip_grad_value: float | None = None
    log_grad_norm: bool = False
    stop_on: int | str | tuple[int | str, ...] | None = None  # (last: positional order kept)

    def __post_init__(self) -> None:
        choice(
            "precision",
            self.precision,
            PRECISIONS,
            "Lightning's '16-mixed' is 'fp16', its 'bf16-mixed' is 'bf16'",
        )
        if not isinstance(self.compile, (bool, Mapping)):
            raise SettingError(
                f"compile must be True, False or torch.compile's keyword arguments, not "
                f"{self.compile!r:.60}; e.g. Options(compile=True) or "
                "Options(compile={'mode': 'max-autotune'})"
            )
        if isinstance(self.compile, Mapping):
            _check_compile(self.compile)
        for name in ("shuffle", "progress", "find_unused_parameters", "log_grad_norm"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "progress" and value is None):
                raise SettingError(
                    f"Options {name} must be True or False"
                    + (
                        " (or None: when standard error is a terminal)"
                        if name == "progress"
                        else ""
                    )
                    + f", not {value!r}"
                    + (
                        " (any non-empty string, 'no' too, is true)"
                        if isinstance(value, str)
                        else ""
                    )
                    + f"; pass {name}=True or {name}=False"
                )
        if not isinstance(self.monitor, str) or not self.monitor:
            raise SettingError(
                f"Options monitor must name an evaluated metric (a string), not "
                f"{self.monitor!r}; e.g. Options(monitor='val_loss') or monitor='val_acc' "
                "with mode='max'"
            )
        count("accumulate", self.accumulate, hint="it is how many batches make one step")
        choice("mode", self.mode, ("min", "max"))
        check_monitor_mode(self.monitor, self.mode)
        choice("nonfinite", self.nonfinite, ("raise", "skip", "ignore"))
        choice("scheduler_every", self.scheduler_every, ("step", "epoch"))
        if self.clip_grad_norm is not None:
            positive(
                "Options clip_grad_norm",
                self.clip_grad_norm,
                "it is the largest total gradient norm kept (a value <= 0 would flip or zero "
                "the update); pass None not to clip",
            )
        _check_clip_value(self.clip_grad_value, self.clip_grad_norm)
        check_schedule(self.eval_every_steps, self.eval_every_epochs)
        check_smoke(self.smoke)
        check_sanity(self.sanity_val_batches)
        check_floor(self.min_epochs, self.min_steps, None, None)  # the Trainer's at fit()
        if self.device is not None:
            _check_device(self.device)
        check_limit("limit_train_batches", self.limit_train_batches)
        check_limit("limit_val_batches", self.limit_val_batches)
        check_decay(self.ema)
        check_max_time(self.max_time)
        check_deterministic(self.deterministic)
        check_stop_on(self.stop_on)


Options.__init__ = ported("Options")(Options.__init__)  # type: ignore[method-assign]


def _check_device(device: Any) -> None:
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise SettingError(
            f"device {device!r} is not a torch device ({e}); pass 'cpu', 'cuda', 'cuda:1', "
            "'mps' or a torch.device"
        ) from e
    if kind == "meta":
        raise SettingError(
            f"device {device!r} holds no data (meta tensors have shapes only), so nothing can "
            "train on it; pass 'cpu', 'cuda' or None to train where the model is (a model "
            "built on meta needs its weights materialised first: module.to_empty(device=...))"
        )


def _check_clip_value(value: Any, norm: float | None) -> None:
    """``Options(clip_grad_value=)``: a finite number above 0, and not with a norm."""
    if value is None:
        return
    positive(
        "Options clip_grad_value",
        value,
        "it is the largest gradient element kept, either sign (0 would zero every gradient, a "
        "negative value set each to it); e.g. clip_grad_value=0.5, or None not to clip",
    )
    if not math.isfinite(value):
        raise SettingError(
            f"Options clip_grad_value must be a finite number above 0, not {value!r}: an "
            "infinite bound clamps nothing; e.g. clip_grad_value=0.5, or None not to clip"
        )
    if norm is not None:
        raise SettingError(
            f"Options(clip_grad_norm={norm!r}, clip_grad_value={value!r}): a run clips one "
            "way (Lightning's gradient_clip_algorithm is 'norm' or 'value'); pass one of "
            "them — to clip by value and then by norm, register both in an optimizer step "
            "pre-hook in the factory (docs/trainer.md, Gradient clipping)"
        )


def _check_compile(kwargs: Mapping[str, Any]) -> None:
    """``Options(compile={...})``: keywords ``torch.compile`` takes (checked here, not when
    the first step compiles)."""
    import inspect

    known = [n for n in inspect.signature(torch.compile).parameters if n != "model"]
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        raise SettingError(
            f"Options(compile=...) has {', '.join(map(repr, unknown))}, which torch.compile "
            f"does not take; its keywords are {', '.join(known)} (e.g. "
            "compile={'mode': 'max-autotune'}; inductor settings go in 'options')"
        )


# summarize's rule for which way a metric improves (campaign.py), and names that rise
_FALLING = ("loss", "err")
# short names of errors, matched as whole words (val_mse, val/ppl; not "cancer"), and of
# the loss terms a loss function's dict logs (val_recon, val_kl: loss_terms.py)
_FALLING_WORDS = frozenset(
    {"mse", "rmse", "mae", "mape", "nll", "ppl", "perplexity", "wer", "cer"}
    | {"recon", "kl", "kld", "ce", "bce", "l1", "l2", "huber"}
)
_RISING = ("acc", "f1", "auc", "precision", "recall", "iou", "dice", "bleu")


def improves(metric: Any) -> Literal["min", "max"] | None:
    """Which way ``metric``'s name says it improves: ``"min"`` for a loss or an error,
    ``"max"`` for an accuracy, F1, AUC...; None when the name does not say."""
    if not isinstance(metric, str):
        return None
    return _improves(metric)


@functools.lru_cache(maxsize=256)  # (every Options() asks it of its monitor)
def _improves(metric: str) -> Literal["min", "max"] | None:
    name = metric.rsplit("/", 1)[-1].lower()
    if any(w in name for w in _FALLING) or _FALLING_WORDS.intersection(re.split(r"[\W_]+", name)):
        return "min"
    return "max" if any(w in name for w in _RISING) else None


def check_monitor_mode(monitor: Any, mode: str) -> None:
    """Warn when ``Options.monitor``'s name says it improves the other way than ``mode``:
    ``best``, ``Checkpointing(best=)`` and ``ReduceLROnPlateau`` would keep the worst."""
    way = improves(monitor)
    if way is not None and way != mode:
        warnings.warn(
            f"Options(monitor={monitor!r}, mode={mode!r}): the name says it improves by "
            f"{'falling' if way == 'min' else 'rising'}, so TrainResult.best and "
            f"Checkpointing(best=) would keep the worst evaluation; pass "
            f"Options(monitor={monitor!r}, mode={way!r}) (mode={mode!r} stays if it is what "
            "you mean)",
            UserWarning,
            stacklevel=outside(),
        )


def check_device(device: torch.device) -> None:
    """The device a run trains on must exist here (checked when ``fit`` starts, so Options
    made on a machine without a GPU can still be shipped to one that has one)."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SettingError(
            f"device {str(device)!r} asks for CUDA, which this machine's torch does not have "
            f"(torch {torch.__version__}, CUDA available: False); pass device='cpu', or None "
            "to train where the model is"
        )
