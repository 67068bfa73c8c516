"""The metric a checkpoint's ``best`` is a value of: a run resumes watching the same one.

A checkpoint records ``Options.monitor`` and ``Options.mode`` (``payload["monitor"]``,
``payload["mode"]``): ``best``, the best-checkpoint ranking and a ``ReduceLROnPlateau``'s
state are values of that metric, better that way. A pruner's state records its own
(``Patience``: metric and mode; ``Threshold``: metric). Resuming with another would compare
the new metric with the old one's best, so it is refused, as another seed or optimizer is.
A checkpoint written before any evaluation holds no best and resumes with any monitor; one
from before they were recorded resumes unchecked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import CheckpointError

__all__ = ["check_monitor"]

_FRESH = (
    "or start a fresh run in another checkpoint directory from its weights: "
    "st.load_state(g, st.load_checkpoint(path)['model'])"
)


def check_monitor(payload: Mapping[str, Any], monitor: str, mode: str, pruner: Any) -> None:
    """The checkpoint's monitor and mode are this run's, and so are its pruner's.

    Raises:
        CheckpointError: the checkpoint's ``best`` or its pruner's state is of another
            metric, or better the other way (old and new named, and the fix).
    """
    if not payload.get("metrics"):  # nothing evaluated yet: no best to misread
        return
    old = payload.get("monitor"), payload.get("mode")
    if old[0] is not None and old != (monitor, mode):
        best = payload.get("best")
        raise CheckpointError(
            f"the checkpoint was written by a run with Options(monitor={old[0]!r}, "
            f"mode={old[1]!r}), this Trainer has Options(monitor={monitor!r}, mode={mode!r}): "
            f"its best ({old[0]}={best if best is None else f'{best:.6g}'}) and best-checkpoint "
            f"ranking (and a ReduceLROnPlateau's state) would be read as {monitor}'s; resume "
            f"with Options(monitor={old[0]!r}, mode={old[1]!r}), {_FRESH}"
        )
    _check_pruner(payload.get("pruner"), pruner)


def _check_pruner(state: Any, pruner: Any) -> None:
    if pruner is None or not isinstance(state, Mapping) or state.get("metric") is None:
        return  # no pruner now, or a state from before its metric was recorded
    name = type(pruner).__qualname__
    ours = getattr(pruner, "state_dict", None)
    if callable(ours) and sorted(ours()) != sorted(state):  # another kind (Patience, Threshold)
        raise CheckpointError(
            f"the checkpoint's pruner state ({', '.join(sorted(state))}) is not a {name}'s "
            f"({', '.join(sorted(ours()))}): it was written with another pruner; resume with "
            f"the pruner it was written with, {_FRESH}"
        )
    metric, mode = getattr(pruner, "metric", None), getattr(pruner, "mode", None)
    moded = "mode" in state  # Threshold has no mode
    was = f"metric={state['metric']!r}" + (f", mode={state['mode']!r}" if moded else "")
    now = f"metric={metric!r}" + (f", mode={mode!r}" if moded else "")
    if was != now:
        fix = f"{state['metric']!r}" + (f", mode={state['mode']!r}" if moded else "")
        raise CheckpointError(
            f"the checkpoint's pruner state is of {was}, this run's {name} watches {now}: "
            f"its best and count would be read as {metric}'s; resume with {name}({fix}), "
            f"{_FRESH}"
        )
