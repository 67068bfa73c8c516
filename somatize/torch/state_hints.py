"""The fix for a state that does not fit a graph, when its keys say which it is.

Shared by ``load_state(g, s)`` (which raises a ``StateError`` with it) and
``module(g).load_state_dict(s)`` (which adds it as a note to torch's ``RuntimeError``):
``call`` spells the loading call each names, ``"load_state(g, {})"`` or
``"model.load_state_dict({})"``, and ``names`` the graph's own names, ``"st.state(g)"`` or
``"model.state_dict()"``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["misfit_hint", "renamed", "resized", "weight_average"]

LOAD_STATE = ("load_state(g, {})", "st.state(g)")


def misfit_hint(m: torch.nn.Module, snapshot: Mapping[str, object], call: str, names: str) -> str:
    """The fix when ``snapshot``'s keys are ``m``'s under other names or a weight average
    alone; "" when they are neither (or they fit)."""
    own = set(m.state_dict())
    missing = sorted(own - set(snapshot))
    unexpected = sorted(set(snapshot) - own)
    return renamed(missing, unexpected, snapshot, call, names) or weight_average(
        m, snapshot, missing, call
    )


def renamed(
    missing: list[str],
    unexpected: list[str],
    snapshot: Mapping[str, object],
    call: str = LOAD_STATE[0],
    names: str = LOAD_STATE[1],
) -> str:
    """The fix, when the keys that do not fit are the graph's under other names: a whole
    checkpoint payload instead of its ``["model"]``, a plain model's names (without the
    node ids), or names with a wrapper's prefix (``module.`` of DDP, ``_orig_mod.`` of
    ``torch.compile``). "" when they are not."""
    if isinstance(snapshot.get("state"), Mapping) and "decay" in snapshot:
        return (
            "this is a checkpoint's weight average, its ['ema']: load its ['state'] over the "
            "model's, " + call.format("{**payload['model'], **payload['ema']['state']}")
        )
    if isinstance(snapshot.get("model"), Mapping):  # (a state dict's values are tensors)
        return (
            "this is a whole checkpoint (model, optimizer, RNG states...): pass its "
            "['model'], " + call.format("st.load_checkpoint(path)['model']")
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
            f"{{graph_name: state[graph_name.split('.', 1)[1]] for graph_name in {names}}}"
        )
    ids = _node_renames(missing, unexpected)
    if ids:
        said = ", ".join(f"the state's {old!r} is the graph's {new!r}" for old, new in ids.items())
        return (
            f"whole nodes fit under other ids: {said} (renamed since?). Build the graph with "
            f"the ids it was trained with, .with_id({next(iter(ids))!r}), or rename the "
            "state's keys: {ids.get(k.split('.', 1)[0], k.split('.', 1)[0]) + '.' + "
            f"k.split('.', 1)[1]: v for k, v in state.items()}} with ids = {ids!r}"
        )
    return ""


def _node_renames(missing: list[str], unexpected: list[str]) -> dict[str, str]:
    """``{state's node id: graph's node id}`` when the keys that do not fit are whole
    nodes' under other ids, each paired with the one node holding the same names inside;
    {} when they are not, or a pairing is ambiguous (two nodes of the same layers)."""

    def by_node(keys: list[str]) -> dict[str, frozenset[str]]:
        nodes: dict[str, set[str]] = {}
        for k in keys:
            node, _, rest = k.partition(".")
            nodes.setdefault(node, set()).add(rest)
        return {node: frozenset(rest) for node, rest in nodes.items()}

    theirs, ours = by_node(unexpected), by_node(missing)
    if not theirs or len(theirs) != len(ours):
        return {}
    renames = {}
    for old, inside in theirs.items():
        match = [new for new, held in ours.items() if held == inside]
        if len(match) != 1:
            return {}
        renames[old] = match[0]
    return renames if len(set(renames.values())) == len(renames) else {}


def resized(shapes: list[str], missing: list[str], unexpected: list[str]) -> str:
    """The fix when every name fits and only shapes differ: the graph's modules were built
    with other sizes than the trained ones. "" otherwise."""
    if not shapes or missing or unexpected:
        return ""
    return (
        "the same names with other shapes: the graph's modules were built with other sizes "
        "than the state's (a width, a vocabulary, a number of classes); build the graph "
        "with the arguments it was trained with"
    )


def weight_average(
    m: torch.nn.Module,
    snapshot: Mapping[str, object],
    missing: list[str],
    call: str = LOAD_STATE[0],
) -> str:
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
        "model's weights, " + call.format("{**payload['model'], **payload['ema']['state']}")
    )
