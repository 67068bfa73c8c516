"""What a Lightning callback handed to the somatize Trainer is written as here: the
``st.Patience`` for an ``EarlyStopping`` given as ``pruner=`` (or among the watchers), the
``st.Checkpointing`` for a ``ModelCheckpoint`` among the watchers. Read off the callback's
attributes; lightning is never imported (nor torch: the core's watchers use it)."""

from __future__ import annotations

from typing import Any

__all__ = ["instead_of_callback", "patience_for"]


def _lightning(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] in ("lightning", "pytorch_lightning")


def patience_for(obj: Any) -> str | None:
    """``pruner=st.Patience(...)`` doing what an ``EarlyStopping`` says (its ``monitor``,
    ``patience``, ``mode`` and ``min_delta``, which it keeps signed by the mode); None for
    anything else."""
    monitor, patience = getattr(obj, "monitor", None), getattr(obj, "patience", None)
    if not isinstance(monitor, str) or isinstance(patience, bool) or not isinstance(patience, int):
        return None
    args = [repr(monitor), f"patience={patience}"]
    if getattr(obj, "mode", None) in ("min", "max"):
        args.append(f"mode={obj.mode!r}")
    delta = getattr(obj, "min_delta", 0.0)
    if isinstance(delta, (int, float)) and delta:
        args.append(f"min_delta={abs(delta):g}")
    return f"pruner=st.Patience({', '.join(args)})"


def _checkpointing_for(obj: Any) -> str | None:
    """``checkpoint=st.Checkpointing(...)`` and the ``Options`` doing what a
    ``ModelCheckpoint`` says; None for anything else."""
    if not hasattr(obj, "save_top_k") or not hasattr(obj, "dirpath"):
        return None
    where = obj.dirpath if isinstance(obj.dirpath, str) else "runs/exp/ckpt"
    top, monitor = obj.save_top_k, getattr(obj, "monitor", None)
    if not isinstance(monitor, str) or not isinstance(top, int) or top <= 0:
        return f"checkpoint=st.Checkpointing({where!r})"
    mode = getattr(obj, "mode", "min")
    return (
        f"checkpoint=st.Checkpointing({where!r}, best={top}) with "
        f"options=st.Options(monitor={monitor!r}, mode={mode!r})"
    )


#: other Lightning callbacks a port lists, by class name, and their settings here
_SETTINGS = {
    "LearningRateMonitor": "nothing: st.TensorBoard(dir) and st.CSVLog(path) log each "
    "step's rate (train/lr, lr)",
    "TQDMProgressBar": "st.Progress(), on by default on a terminal; Options(progress=True) "
    "elsewhere",
    "RichProgressBar": "st.Progress(), on by default on a terminal; Options(progress=True) "
    "elsewhere",
    "ModelSummary": "print(st.model_summary(g))",
    "Timer": "options=st.Options(max_time=...)",
    "EMAWeightAveraging": "options=st.Options(ema=decay)",
}


def instead_of_callback(obj: Any) -> str | None:
    """What to write for a Lightning callback given where a watcher or a pruner goes, or
    None when ``obj`` is not one."""
    if not _lightning(obj):
        return None
    fix = patience_for(obj) or _checkpointing_for(obj) or _SETTINGS.get(type(obj).__name__)
    if fix:
        return f"{type(obj).__qualname__} is a Lightning callback; here: {fix}"
    return (
        f"{type(obj).__qualname__} is a Lightning callback, which runs under lightning.Trainer "
        "(a LightningGraph there: docs/lightning.md); docs/trainer.md's 'Coming from "
        "Lightning' names the Trainer's own setting for the common ones"
    )
