"""A graph's weights as a name-keyed snapshot: ``state(g)`` and ``load_state(g, snapshot)``.

Names are those of ``module(g).state_dict()`` (``enc.emb.weight``); a snapshot is plain
CPU tensors, so it feeds ``fedavg``, checkpoints and other processes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import StateError
from ..graph import Graph
from .module import module

__all__ = ["load_state", "state"]


def state(g: Graph) -> dict[str, torch.Tensor]:
    """A snapshot of every node module's state: detached CPU copies, named as in
    ``module(g).state_dict()``."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module(g).state_dict().items()}


def load_state(g: Graph, snapshot: Mapping[str, torch.Tensor]) -> None:
    """Load a name-keyed state into the graph's modules (in place; keys then follow).

    Raises:
        StateError: missing or unexpected keys, values that are not tensors, shape
            mismatches — all listed, before anything is loaded; or ``snapshot`` is not
            a state dict at all (a ``TrainResult``: pass ``result.state``).
    """
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
                _renamed(missing, unexpected, snapshot)
                or _average(m, snapshot, missing)
                or "was it saved from a different graph? compare sorted(state(g)) with the "
                "saved keys"
            )
            + ")"
        )
    m.load_state_dict(dict(snapshot), strict=True)


def _renamed(missing: list[str], unexpected: list[str], snapshot: Mapping[str, object]) -> str:
    """The fix, when the keys that do not fit are the graph's under other names: a whole
    checkpoint payload instead of its ``["model"]``, a plain model's names (without the
    node ids), or names with a wrapper's prefix (``module.`` of DDP, ``_orig_mod.`` of
    ``torch.compile``). "" when they are not."""
    if isinstance(snapshot.get("state"), Mapping) and "decay" in snapshot:
        return (
            "this is a checkpoint's weight average, its ['ema']: load its ['state'] over the "
            "model's, load_state(g, {**payload['model'], **payload['ema']['state']})"
        )
    if isinstance(snapshot.get("model"), Mapping):  # (a state dict's values are tensors)
        return (
            "this is a whole checkpoint (model, optimizer, RNG states...): pass its "
            "['model'], load_state(g, st.load_checkpoint(path)['model'])"
        )
    if not missing or not unexpected:
        return ""
    for prefix in ("module.", "_orig_mod."):
        if all(k.startswith(prefix) and k[len(prefix) :] in missing for k in unexpected):
            return (
                f"the state's names carry the prefix {prefix!r} of a wrapper it was saved "
                f"through: strip it, {{k.removeprefix({prefix!r}): v for k, v in "
                "state.items()}"
            )
    short = {name.split(".", 1)[1]: name for name in missing if "." in name}
    if len(short) == len(missing) and sorted(short) == sorted(unexpected):
        example = next(iter(sorted(unexpected)))
        return (
            "the state's names lack the graph's node ids (a plain model's state_dict?): "
            f"name each as the graph does ({example!r} is {short[example]!r} here), e.g. "
            "{graph_name: state[graph_name.split('.', 1)[1]] for graph_name in st.state(g)}"
        )
    return ""


def _average(m: torch.nn.Module, snapshot: Mapping[str, object], missing: list[str]) -> str:
    """The fix when ``snapshot`` is exactly what ``Options(ema=)`` averages (trainable
    parameters and floating-point buffers): a checkpoint's ``["ema"]["state"]`` alone,
    which holds no integer buffer nor frozen parameter. "" when it is not."""
    held = m.state_dict(keep_vars=True)
    averaged = {
        k
        for k, t in held.items()
        if t.is_floating_point() and (t.requires_grad or not isinstance(t, torch.nn.Parameter))
    }
    if not missing or set(snapshot) != averaged:
        return ""
    return (
        "it is what a weight average holds, a checkpoint's ['ema']['state']: load it over the "
        "model's weights, load_state(g, {**payload['model'], **payload['ema']['state']})"
    )
