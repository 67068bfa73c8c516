"""A graph's weights as a name-keyed snapshot: ``state(g)`` and ``load_state(g, snapshot)``.

Names are those of ``module(g).state_dict()`` (``enc.emb.weight``); a snapshot is plain
CPU tensors, so it feeds ``fedavg``, checkpoints and other processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import StateError
from ..graph import Graph
from .module import module
from .not_a_graph import require_graph
from .state_hints import renamed, resized, weight_average

__all__ = ["load_state", "state"]


def state(g: Graph) -> dict[str, torch.Tensor]:
    """A snapshot of every node module's state: detached CPU copies, named as in
    ``module(g).state_dict()``."""
    require_graph(g, "st.state")
    return {k: v.detach().to("cpu", copy=True) for k, v in module(g).state_dict().items()}


def load_state(g: Graph, snapshot: Mapping[str, torch.Tensor]) -> None:
    """Load a name-keyed state into the graph's modules (in place; keys then follow).

    ``snapshot`` may also be a whole Trainer checkpoint (``st.load_checkpoint(path)``):
    its weights as evaluated are loaded — under ``Options(ema=)`` the average, which the
    checkpoint's validation judged (``["ema"]["state"]`` over ``["model"]``), else
    ``["model"]``.

    Raises:
        StateError: missing or unexpected keys, values that are not tensors, shape
            mismatches — all listed, before anything is loaded; or ``snapshot`` is not
            a state dict at all (a ``TrainResult``: pass ``result.state``).
    """
    require_graph(g, "st.load_state")
    snapshot = evaluated(snapshot)
    if not isinstance(snapshot, Mapping):
        hint = (
            f"a {type(snapshot).__qualname__} holds one in .state — pass "
            f"load_state(g, result.state)"
            if hasattr(snapshot, "state")
            else "pass st.state(g), TrainResult.state or a checkpoint's ['model']"
        )
        raise StateError(
            f"load_state takes a state dict (name -> tensor), not {snapshot!r:.80}; {hint}"
        )
    m = module(g)
    own = m.state_dict()
    missing = sorted(set(own) - set(snapshot))
    unexpected = sorted(set(snapshot) - set(own))
    not_tensors = sorted(
        k for k in own if k in snapshot and not isinstance(snapshot[k], torch.Tensor)
    )
    shapes = [
        f"{k}: graph has {tuple(own[k].shape)}, state has {tuple(snapshot[k].shape)}"
        for k in own
        if k in snapshot and k not in not_tensors and own[k].shape != snapshot[k].shape
    ]
    problems = []
    if not_tensors:
        problems.append(f"not tensors: {', '.join(not_tensors[:10])}")
    if missing:
        problems.append(
            f"missing keys: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}"
        )
    if unexpected:
        problems.append(
            f"unexpected keys: {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}"
        )
    if shapes:
        problems.append("shape mismatches: " + "; ".join(shapes[:10]))
    if problems:
        raise StateError(
            "the state does not fit the graph — "
            + " | ".join(problems)
            + " ("
            + (
                renamed(missing, unexpected, snapshot)
                or weight_average(m, snapshot, missing)
                or resized(shapes, missing, unexpected)
                or "was it saved from a different graph? compare sorted(state(g)) with the "
                "saved keys"
            )
            + ")"
        )
    m.load_state_dict(dict(snapshot), strict=True)


def evaluated(snapshot: Any) -> Any:
    """A Trainer checkpoint's weights as its evaluation saw them (the EMA average over the
    trained weights, where it holds one); anything else as it is."""
    from .checkpoint import FORMAT

    if not isinstance(snapshot, Mapping) or snapshot.get("format") != FORMAT:
        return snapshot
    average = snapshot.get("ema")
    model = snapshot.get("model")
    if isinstance(average, Mapping) and isinstance(average.get("state"), Mapping):
        return {**model, **average["state"]} if isinstance(model, Mapping) else model
    return model
