"""What a Lightning argument is called here: a note on the ``TypeError`` Python raises
for an unexpected keyword (``Trainer(max_epochs=3)``) and an ``AttributeError`` for a
Lightning method (``trainer.validate``), naming the somatize spelling — the rows of
docs/trainer.md's "Coming from Lightning" table that a port writes first. (A Lightning
callback given as a watcher or a pruner: ``somatize.callback_hints``.)"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ..errors import add_note
from ..not_a_module import Refused
from ..stack import outside

__all__ = [
    "ATTRIBUTES",
    "LIGHTNING",
    "METHODS",
    "lightning_methods",
    "ported",
    "warn_lightning_module",
]

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = {
    "accumulate_grad_batches": "Options(accumulate=...)",
    "gradient_clip_val": "Options(clip_grad_norm=...)",
    "precision": 'Options(precision="bf16") or "fp16"',
    "val_check_interval": "Options(eval_every_steps=N), in optimizer steps",
    "check_val_every_n_epoch": "Options(eval_every_epochs=N)",
    "num_sanity_val_steps": "Options(sanity_val_batches=N)",
    "fast_dev_run": "Options(smoke=True)",
    "enable_progress_bar": "Options(progress=False)",
    "max_time": "Options(max_time=...)",
    "min_epochs": "Options(min_epochs=...)",
    "min_steps": "Options(min_steps=...)",
    "deterministic": "Options(deterministic=True)",
    "limit_train_batches": "Options(limit_train_batches=...)",
    "limit_val_batches": "Options(limit_val_batches=...)",
    "accelerator": 'Options(device="cuda") (the default: where the model is)',
    "devices": "torchrun for several processes; Options(device=...) for one",
    "strategy": "torchrun for DDP; Options(find_unused_parameters=True) for "
    "'ddp_find_unused_parameters_true'",
    "log_every_n_steps": "watchers=[st.TensorBoard(dir, every_steps=N)], "
    "st.CSVLog(path, every_steps=N) or st.Progress(every_steps=N): a watcher's own setting",
    "gradient_clip_algorithm": 'Options(clip_grad_value=v) for "value" (clip_grad_norm=v '
    'for "norm"), v being gradient_clip_val',
    "track_grad_norm": "Options(log_grad_norm=True): each step's L2 gradient norm to the "
    "watchers (TensorBoard's train/grad_norm); clip_grad_norm tells it too",
}


#: Lightning switches whose default here is already "off"
_OFF = {
    "enable_checkpointing": "nothing: no checkpoint is written unless "
    "checkpoint=st.Checkpointing(dir)",
    "enable_model_summary": "nothing: fit prints no summary; print(st.model_summary(g)) for one",
}
#: a Lightning logger's keywords, for the watcher that replaces it
_LOGGER = {
    "log_every_n_steps": "{cls}({arg}, every_steps=N)",
    "save_dir": "{cls}({arg}): the run's own {what}, e.g. {example}",
    "name": "{cls}({arg}): the run's own {what}, e.g. {example}",
    "version": "{cls}({arg}): the run's own {what}, e.g. {example}",
}


def _logger(cls: str, arg: str, what: str, example: str) -> dict[str, str]:
    return {k: v.format(cls=cls, arg=arg, what=what, example=example) for k, v in _LOGGER.items()}


def _in_trainer(instead: str) -> str:
    """An Options row as written in ``Trainer(...)``: ``options=st.Options(...)``."""
    return f"options=st.{instead}" if instead.startswith("Options(") else instead


#: owner -> Lightning keyword -> what to write instead
LIGHTNING: dict[str, dict[str, str]] = {
    "Trainer": {
        "max_epochs": "Trainer(epochs=...)",
        "callbacks": "watchers=[...] (logging), pruner=st.Patience(...) (early stopping), "
        "checkpoint=st.Checkpointing(dir) (ModelCheckpoint)",
        "logger": "watchers=[st.TensorBoard(dir)] or [st.CSVLog(path)]",
        "default_root_dir": "checkpoint=st.Checkpointing(dir)",
        **{k: _in_trainer(v) for k, v in _OPTIONS.items()},
        **_OFF,
    },
    "Options": {
        "max_epochs": "Trainer(epochs=...)",
        **_OPTIONS,
        **_OFF,
    },
    "Checkpointing": {
        "dirpath": "Checkpointing(dir)",
        "monitor": "Options(monitor=...), which best= ranks by",
        "mode": "Options(mode=...)",
        "save_top_k": "Checkpointing(best=K) (keep=K for the latest)",
        "save_last": "nothing: the latest is always kept and named by last",
        "every_n_train_steps": "Checkpointing(every_steps=N)",
    },
    # EarlyStopping's keywords
    "Patience": {
        "monitor": "Patience(metric), the first argument: st.Patience('val_loss', patience=3)",
        "verbose": "nothing: why the run stopped is result.pruned_reason",
        "check_on_train_epoch_end": "nothing: the pruner is asked after each evaluation, "
        "whose schedule is Options(eval_every_steps=) or eval_every_epochs=",
        "stopping_threshold": "a pruner of its own, st.Threshold(metric, lower=v) "
        "(upper=v under mode 'max')",
        "divergence_threshold": "a pruner of its own, st.Threshold(metric, upper=v) "
        "(lower=v under mode 'max')",
    },
    # CSVLogger's and TensorBoardLogger's
    "CSVLog": _logger("CSVLog", "path", "file", "st.CSVLog('runs/exp/version_0/metrics.csv')"),
    "TensorBoard": _logger(
        "TensorBoard", "log_dir", "directory", "st.TensorBoard('runs/exp/version_0')"
    ),
    "fit": {
        "ckpt_path": 'fit(..., resume="last") or resume=path',
        "train_dataloaders": "fit(g, train) (the second argument)",
        "val_dataloaders": "fit(g, train, val=loader), or val={'a': loader_a, ...}",
        "datamodule": "fit(g, dm.train_dataloader(), val=dm.val_dataloader())",
    },
    **{
        call: {
            "ckpt_path": "load the checkpoint into the graph first, "
            'st.load_state(g, st.load_checkpoint(result.best_checkpoint)) for "best" '
            f"(result.checkpoint for the last), then trainer.{call}(g, data)",
            "dataloaders": f"trainer.{call}(g, loader) (the second argument)",
            "datamodule": f"trainer.{call}(g, dm.{loader}_dataloader())",
        }
        for call, loader in (("evaluate", "test"), ("predict", "predict"))
    },
}
#: Lightning's methods of a Trainer, and what to call here
METHODS = {
    "validate": "trainer.evaluate(g, data)",
    "test": "trainer.evaluate(g, data)",
}
#: Lightning's attributes of a Trainer (read in ``configure_optimizers``, a callback), and
#: what to read here
ATTRIBUTES = {
    "estimated_stepping_batches": "trainer.planned_steps(train), the optimizer steps fit "
    "plans (e.g. OneCycleLR(opt, max_lr, total_steps=trainer.planned_steps(train)))",
    "global_step": "result.steps of the TrainResult fit returns (a node reads ctx.step)",
    "current_epoch": "result.epochs of the TrainResult fit returns",
}
_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")


def lightning_methods(cls: type) -> type:
    """Class decorator: ``cls`` (the Trainer) answers Lightning's method names (``METHODS``,
    ``trainer.validate``) and attributes (``ATTRIBUTES``, ``trainer.global_step``) with an
    ``AttributeError`` naming what to write instead."""
    for name, instead in METHODS.items():
        setattr(cls, name, Refused(f"{name!r} is Lightning's Trainer method; here: {instead}"))
    for name, instead in ATTRIBUTES.items():
        setattr(cls, name, Refused(f"{name!r} is Lightning's Trainer attribute; here: {instead}"))
    return cls


def ported(owner: str) -> Callable[[F], F]:
    """Decorate ``owner``'s ``__init__`` (``Trainer``, ``Options``, ``Checkpointing``, and
    ``Patience``, ``CSVLog`` and ``TensorBoard`` for ``EarlyStopping``'s and the loggers'
    keywords) or ``fit``, ``evaluate``, ``predict``: a Lightning keyword it does not take gets
    a note naming what to write instead."""
    names = LIGHTNING[owner]

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except TypeError as e:
                found = _UNEXPECTED.search(str(e))
                if found and found[1] in names and found[1] in kwargs:
                    add_note(e, f"{found[1]} is Lightning's; here: {names[found[1]]}")
                elif found and found[1] in kwargs:
                    close(e, found[1], fn)
                raise

        return cast(F, call)

    return decorate


def close(e: TypeError, given: str, fn: Callable[..., Any]) -> None:
    """A note on ``e`` naming the keywords of ``fn`` closest to the misspelt ``given``
    (``epoch`` → ``epochs``), when there are any."""
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
    near = difflib.get_close_matches(given, params, n=2, cutoff=0.6)
    if near:
        add_note(e, f"did you mean {' or '.join(map(repr, near))}?")


#: a LightningModule's hooks that hold a run's training, and what each becomes here
_HOOKS = {
    "training_step": "its loss as loss= (loss=None with forward returning it)",
    "configure_optimizers": "optimizer= and scheduler=",
    "validation_step": "metrics=",
}


def warn_lightning_module(model: Any) -> None:
    """Warn when ``fit`` is given a ``LightningModule`` of the user's own hooks: the Trainer
    calls its ``forward`` and the Trainer's ``loss=``, never its ``training_step`` (a loss of
    its own, a regularizer), ``configure_optimizers`` or ``validation_step`` — a run that
    differs from the Lightning one without a word. Read off the class (lightning is never
    imported); the network the module holds, or a graph, is not warned about."""
    mro = type(model).__mro__
    base = next(
        (
            i
            for i, c in enumerate(mro)
            if c.__name__ == "LightningModule"
            and c.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
        ),
        None,
    )
    if base is None:
        return
    own = [h for h in _HOOKS if any(h in vars(c) for c in mro[:base])]
    if not own:
        return
    name = type(model).__qualname__
    hooks = " or ".join([", ".join(own[:-1]), own[-1]] if len(own) > 1 else own)
    warnings.warn(
        f"fit() got {name}, a LightningModule: the somatize Trainer calls its forward, "
        f"model(x), and the Trainer's loss= on the output, never its "
        f"{hooks}, so what {'they hold' if len(own) > 1 else 'it holds'} is not in "
        f"this run. Port {'them' if len(own) > 1 else 'it'}: "
        + "; ".join(f"{h}: {_HOOKS[h]}" for h in own)
        + " (docs/trainer.md, 'Coming from Lightning'), and fit the network it holds, "
        "fit(lit.net, ...) (a LightningGraph's graph, fit(lg.graph, ...)); or train it under "
        "lightning.Trainer",
        UserWarning,
        stacklevel=outside(),
    )
