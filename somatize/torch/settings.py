"""Checks of the Trainer's settings: each bad value is a ``SettingError`` naming it and the fix."""

from __future__ import annotations

import inspect
import math
import re
import types
from collections.abc import Iterable, Mapping
from typing import Any

from ..callback_hints import instead_of_callback
from ..errors import SettingError
from ..watchers import check_watchers

__all__ = [
    "check_arguments",
    "check_batch",
    "check_fit",
    "check_loss",
    "check_measured",
    "check_metrics",
    "check_parts",
    "choice",
    "count",
    "positive",
]


def count(name: str, value: Any, minimum: int = 1, hint: str = "") -> None:
    """``value`` must be an int (not a bool, not a float) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        near = round(value) if isinstance(value, float) and math.isfinite(value) else None
        owner, _, arg = name.rpartition(" ")  # ("Options", "accumulate") or ("", "epochs")
        said = f"{owner}({arg}={near})" if owner else f"{arg}={near}"
        raise SettingError(
            f"{name} must be a whole number, not {value!r}"
            + (f" (did you mean {said}?)" if near is not None and near >= minimum else "")
            + (f"; {hint}" if hint else "")
        )
    if value < minimum:
        raise SettingError(
            f"{name} must be at least {minimum}, not {value}" + (f"; {hint}" if hint else "")
        )


def positive(name: str, value: Any, hint: str = "") -> None:
    """``value`` must be a number above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SettingError(
            f"{name} must be a number above 0, not {value!r}" + (f"; {hint}" if hint else "")
        )


def choice(name: str, value: Any, allowed: Iterable[str], hint: str = "") -> None:
    """``value`` must be one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise SettingError(
            f"{name} must be one of {', '.join(map(repr, allowed))}, not {value!r}"
            + (f" ({hint})" if hint else "")
        )


def check_arguments(
    optimizer: Any,
    scheduler: Any,
    epochs: Any,
    max_steps: Any,
    micro_batches: Any,
    metrics: Any,
    pruner: Any,
    seed: Any,
) -> None:
    """The Trainer constructor's arguments."""
    if optimizer is not None and not callable(optimizer):
        raise SettingError(
            f"optimizer must be a factory over parameters, not {type(optimizer).__qualname__}; "
            "e.g. optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)"
        )
    if scheduler is not None and not callable(scheduler):
        raise SettingError(
            f"scheduler must be a factory over the optimizer, not {type(scheduler).__qualname__}; "
            "e.g. scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 10)"
        )
    _check_factory("optimizer", optimizer, "params", "torch.optim.AdamW(params, lr=1e-3)")
    _check_factory("scheduler", scheduler, "opt", "torch.optim.lr_scheduler.StepLR(opt, 10)")
    count("micro_batches", micro_batches, hint="it is how many chunks each batch is split into")
    if epochs is not None:
        count("epochs", epochs, hint="a run trains whole epochs; use max_steps to stop mid-epoch")
    if max_steps is not None:
        count("max_steps", max_steps)
    check_metrics(metrics)
    if pruner is not None and not (hasattr(pruner, "report") and hasattr(pruner, "should_prune")):
        name = type(pruner).__qualname__
        raise SettingError(
            f"pruner must have report(value, step) and should_prune(), and "
            f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name} has not; "
            + (instead_of_callback(pruner) or "e.g. st.Patience('val_loss', patience=3)")
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise SettingError(
            f"seed must be a whole number from 0 to 2**32 - 1 (what numpy accepts), not {seed!r}"
        )


def _check_factory(name: str, factory: Any, arg: str, example: str) -> None:
    """A factory must take one argument (the parameters, the optimizer) and no other: a
    class needing more (``StepLR``'s ``step_size``), or a function taking none, is refused."""
    if factory is None or _takes_one(factory):
        return
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: it is called as it is
        return
    try:
        signature.bind(object())
    except TypeError as e:
        what = (
            f"the class {factory.__qualname__}"
            if isinstance(factory, type)
            else f"{getattr(factory, '__qualname__', type(factory).__qualname__)}{signature}"
        )
        raise SettingError(
            f"{name} is called with one argument ({arg}), and {what} cannot be ({e}); pass "
            f"a factory of one argument, e.g. {name}=lambda {arg}: {example}"
        ) from None


def _takes_one(f: Any) -> bool:
    """Whether a plain Python function (a lambda, a ``def``) takes one positional argument,
    read off its code: what ``inspect.signature(f).bind(x)`` would allow, without building
    the signature (a few µs a Trainer). False when unsure (anything else): then it is asked."""
    if type(f) is not types.FunctionType or "__wrapped__" in vars(f) or "__signature__" in vars(f):
        return False
    code = f.__code__
    positional = code.co_argcount
    kwonly = code.co_varnames[positional : positional + code.co_kwonlyargcount]
    if any(k not in (f.__kwdefaults__ or {}) for k in kwonly):
        return False
    required = positional - len(f.__defaults__ or ())
    return required <= 1 and (positional >= 1 or bool(code.co_flags & inspect.CO_VARARGS))


def check_parts(loss: Any, checkpoint: Any, watchers: Any, options: Any) -> None:
    """The Trainer constructor's arguments that are objects of a given kind."""

    from .checkpoint import Checkpointing
    from .options import Options

    check_loss(loss)
    if not isinstance(options, Options):
        extra = f"st.Options(**{options!r})" if isinstance(options, Mapping) else "st.Options(...)"
        raise SettingError(
            f"options must be an st.Options, not a {type(options).__qualname__}; e.g. "
            f"options={extra}"
        )
    if checkpoint is not None and not isinstance(checkpoint, Checkpointing):
        where = f"{checkpoint!r}" if isinstance(checkpoint, str) else "'runs/ckpt'"
        raise SettingError(
            f"checkpoint must be an st.Checkpointing, not a {type(checkpoint).__qualname__}; "
            f"e.g. checkpoint=st.Checkpointing({where}, keep=3)"
        )
    try:
        check_watchers(watchers, "Trainer(watchers=...)")
    except TypeError as e:  # the Graph's check, as the Trainer's error
        raise SettingError(str(e)) from None


def check_loss(loss: Any) -> None:
    """``loss``: a function ``loss(output, target)`` or None — not a loss class."""
    import torch

    if isinstance(loss, type):
        fn = _functional(loss.__name__) if issubclass(loss, torch.nn.Module) else ""
        raise SettingError(
            f"loss is the class {loss.__qualname__}, not a loss; pass an instance, "
            f"{loss.__name__}(){f' or {fn}' if fn else ''}"
        )
    if loss is not None and not callable(loss):
        raise SettingError(
            f"loss must be a function loss(output, target) -> scalar, not {loss!r}; e.g. "
            "loss=F.cross_entropy, or None when the graph's output is the loss"
        )


def _functional(name: str) -> str:
    """``CrossEntropyLoss`` → ``F.cross_entropy``: the functional form of a loss class
    in ``torch.nn.functional``, or "" when it has none under that name."""
    from torch.nn import functional

    if not name.endswith("Loss"):
        return ""
    words = re.findall(r"[A-Z]+[0-9]*(?![a-z])|[A-Z][a-z0-9]*", name.removesuffix("Loss"))
    snake = "_".join(w.lower() for w in words)
    found = next(
        (c for c in (snake, f"{snake}_loss") if callable(getattr(functional, c, None))), ""
    )
    return f"F.{found}" if found else ""


def check_measured(metrics: Any, loss: Any, owner: str = "Trainer") -> None:
    """``metrics`` need ``loss``: a metric measures the output against the target."""
    if metrics and loss is None:
        raise SettingError(
            f"metrics= ({', '.join(map(repr, metrics))}) measure the graph's output against "
            f"the batch's target, which loss= splits off; without loss= the {owner}'s graph "
            "gets the whole batch and returns its loss, so there is no output to measure. "
            "Pass loss= (the graph then returns its prediction), or report what you measure "
            "from a node: Done(value, metrics={...})"
        )


def check_metrics(metrics: Any) -> None:
    """``metrics``: a mapping of names (as logged, less the ``val_`` prefix) to metrics."""
    if metrics is None:
        return
    if not isinstance(metrics, Mapping):
        raise SettingError(
            f"metrics is a dict name → fn, not a {type(metrics).__qualname__}; "
            "e.g. metrics={'acc': st.accuracy} (evaluated as val_acc)"
        )
    for name, fn in metrics.items():
        if not isinstance(name, str):
            raise SettingError(
                f"metric names must be strings, not {name!r} ({type(name).__qualname__}); "
                "e.g. metrics={'acc': st.accuracy} (evaluated as val_acc)"
            )
        if not name.strip():
            raise SettingError(
                f"metric name {name!r} is blank: it would be logged as 'val_{name}'; name "
                "the metric (e.g. metrics={'acc': st.accuracy}, logged as val_acc)"
            )
        if name == "loss":
            raise SettingError(
                "metric name 'loss' is reserved: the loss is evaluated as val_loss; "
                "name the metric otherwise (e.g. 'nll')"
            )
        if name.startswith("val_"):
            raise SettingError(
                f"metric {name!r} would be evaluated as 'val_{name}': name metrics without "
                f"the val_ prefix ({name[4:]!r}), they are prefixed when evaluated"
            )
        if not callable(fn) and not all(
            callable(getattr(fn, m, None)) for m in ("reset", "update", "compute")
        ):
            raise SettingError(
                f"metric {name!r} is a {type(fn).__qualname__}, neither a function "
                "fn(output, target) nor an object with reset/update/compute; pass e.g. "
                "st.accuracy or a torchmetrics metric"
            )


def check_fit(trainer: Any, val: Any) -> None:
    """What ``fit`` needs of the settings together, checked before any step is trained."""
    from .schedule import check_floor, check_schedule_fits

    o = trainer.options
    check_floor(o.min_epochs, o.min_steps, trainer.epochs, trainer.max_steps)
    if trainer.pruner is not None and val is None:
        raise SettingError(
            "a pruner is asked after each evaluation, but fit() got no val= data; "
            "pass val=batches (or drop the pruner)"
        )
    best = trainer.checkpoint.best if trainer.checkpoint is not None else 0
    if best and val is None:
        raise SettingError(
            f"Checkpointing(best={best}) keeps the checkpoints that rank best by "
            f"Options(monitor={trainer.options.monitor!r}) at evaluations, but fit() got no "
            "val= data to evaluate on; pass val=batches (or Checkpointing(best=0))"
        )
    if val is None and trainer.pruner is None:
        return  # (what follows checks val= and a pruner against what is monitored)
    from .pruning import check_study_direction
    from .valsets import monitored

    monitor = monitored(o.monitor, val)  # (several sets: the first's loss, for result.best)
    if monitor != o.monitor and (best or _watches_monitor(trainer.pruner)):
        monitor = o.monitor  # something acts on it: the set is named, not defaulted (refused)
    if val is not None:
        from .data_checks import check_data
        from .limits import length
        from .loss_terms import gives_terms
        from .valsets import check_reusable, check_val, evaluated_names

        for name, data in val.items() if isinstance(val, Mapping) else [("", val)]:
            what = f"val set {name!r}" if name else "fit()'s val"
            check_data(data, what, trainer._split)
            if length(data) == 0:  # (found out only at the first evaluation, an epoch in)
                raise SettingError(
                    f"{what} is an empty {type(data).__qualname__}: there is nothing to "
                    "evaluate on; pass at least one batch, or "
                    + ("drop it from val=" if name else "train without evaluating (no val=)")
                )
        check_val(val, trainer.metrics)
        check_reusable(val, trainer.epochs, o)
        known = evaluated_names(val, trainer.metrics)
        check_monitor(monitor, known, val, terms=gives_terms(trainer.loss))
        check_schedule_fits(o.eval_every_epochs, trainer.epochs)
    check_pruner_mode(trainer.pruner, monitor, o.mode)
    check_study_direction(trainer.pruner, monitor, o.mode)


def _watches_monitor(pruner: Any) -> bool:
    """Whether a pruner acts on ``Options.monitor`` (an Optuna trial), not a metric of its own."""
    return pruner is not None and not hasattr(pruner, "metric")


def check_pruner_mode(pruner: Any, monitor: str, mode: str) -> None:
    """A ``Patience`` left at its default mode ("min") must not watch ``Options.monitor``
    while ``Options(mode="max")`` says it improves upwards: it would stop on progress.

    A mode given explicitly is kept, whatever ``Options.mode`` says (stopping when a loss
    stops rising is a choice, and tests make it to stop a run early on purpose)."""
    from .pruning import Patience

    if not isinstance(pruner, Patience) or pruner.mode_given or pruner.metric != monitor:
        return
    if pruner.mode != mode:
        raise SettingError(
            f"Patience({pruner.metric!r}) stops when {pruner.metric} stops falling (its mode "
            f"defaults to {pruner.mode!r}), but Options(monitor={monitor!r}, mode={mode!r}) "
            f"says it improves by rising; pass Patience({pruner.metric!r}, mode={mode!r}) "
            f"(or mode={pruner.mode!r} explicitly if that is what you mean)"
        )


def check_monitor(monitor: str, known: list[str], val: Any = None, terms: bool = False) -> None:
    """``Options.monitor`` must name a metric evaluation produces (``known``: ``val_loss``,
    ``val_<name>`` of ``Trainer(metrics=...)``, each prefixed by its set's name for a dict
    ``val=``), or a node's ``val_<node>/<name>`` (which only the evaluation knows; it
    checks those). ``terms``: the loss function may give terms (``loss_terms.py``), known
    once it runs: a plain ``val_<name>`` is left to the sanity check (or the first
    evaluation) to check."""
    if monitor in known or (monitor.startswith("val_") and "/" in monitor):
        return
    several = isinstance(val, Mapping)
    prefixes = [f"val_{name}_" for name in val] if several else ["val_"]
    if terms and any(monitor.startswith(p) and monitor != p for p in prefixes):
        return
    if f"val_{monitor}" in known:
        hint = f"did you mean {'val_' + monitor!r}? evaluated metrics carry the val_ prefix"
    elif several:
        hint = (
            "with several validation sets every name carries its set's, and what acts on "
            "the monitor (best checkpoints, an Optuna trial) needs the set named: e.g. "
            f"Options(monitor={known[0]!r})"
        )
    else:
        hint = "set Options(monitor=...) to one of them"
    node = "val_<set>_<node>/<name>" if several else "val_<node>/<name>"
    raise KeyError(
        f"Options(monitor={monitor!r}) names a metric evaluation does not produce; it "
        f"evaluates {', '.join(known)} (and each node's {node}): {hint}"
    )


def check_batch(x: Any, batch: Any) -> None:
    """A batch's input must hold a tensor, or raw text (a list of strings: its rows)."""
    from .batches import _leaves, text_rows

    if not _leaves(x) and text_rows(x) is None:
        raise SettingError(
            f"a batch of type {type(batch).__qualname__} holds no tensor to feed the model; a "
            "batch is a tensor, an (x, y) pair, a dict with 'x' (and 'y'), or nested "
            "tuples/lists/dicts of tensors or of raw text (a list of strings, a row per "
            "example) — convert it (e.g. torch.as_tensor) or use a DataLoader"
        )
