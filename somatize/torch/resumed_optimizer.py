"""The optimizer a run resumes with: the checkpoint's class, its hyper-parameters, and the
frozen nodes whose parameters it leaves out.

A checkpoint names its optimizer's class (``payload["optimizer_class"]``); resuming with
another is refused, and a hyper-parameter changed since (say ``lr``) warns while the
checkpoint's value is kept, so the run resumes exactly. It names the nodes that were
frozen (``payload["frozen"]``; a Lightning checkpoint's ``hyper_parameters["frozen"]``):
resuming into a graph that freezes other nodes is refused before the optimizer's state —
of other parameters — is loaded, naming the nodes and the ``g.freeze`` call that rebuilds
the graph as it was trained.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import CheckpointError
from ..stack import outside

__all__ = ["check_clip", "check_frozen", "check_optimizer", "frozen_nodes", "optimizer_class"]

# keys a scheduler writes into param groups as it runs: they change without the user
_SCHEDULED = {"lr", "initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"}
_SCHEDULED_MOMENTUM = {"momentum", "betas"}


def optimizer_class(opt: torch.optim.Optimizer) -> str:
    t = type(opt)
    return f"{t.__module__}.{t.__qualname__}"


def check_optimizer(payload: Mapping[str, Any], opt: torch.optim.Optimizer) -> None:
    """The checkpoint's optimizer is this run's class; changed hyper-parameters warn.

    Raises:
        CheckpointError: the checkpoint was written with another optimizer class (both
            named), or its param groups are of another kind or number.

    Warns:
        UserWarning: a hyper-parameter differs (old and new values named); the
            checkpoint's value is kept, so the run resumes exactly.
    """
    ours = optimizer_class(opt)
    theirs = payload.get("optimizer_class")
    groups = payload["optimizer"]["param_groups"]
    if theirs is not None and theirs != ours:
        raise CheckpointError(
            f"the checkpoint was written with optimizer {theirs}, this run uses {ours}; "
            "resume with the optimizer it was written with, or start a fresh run from its "
            "weights: st.load_state(g, st.load_checkpoint(path)['model'])"
        )
    if len(groups) != len(opt.param_groups):
        raise CheckpointError(
            f"the checkpoint's optimizer has {len(groups)} parameter group(s), this run's "
            f"{ours} has {len(opt.param_groups)}; resume with the optimizer it was written with"
        )
    for i, (old, new) in enumerate(zip(groups, opt.param_groups)):
        scheduled = "initial_lr" in old or "initial_lr" in new
        keys = (set(old) | set(new)) - {"params"} - _SCHEDULED
        if theirs is None and {k for k in keys if (k in old) != (k in new)}:
            raise CheckpointError(
                f"the checkpoint's optimizer is not this run's {ours}: its parameter group "
                f"{i} has settings {sorted(set(old) - {'params'})}, this one "
                f"{sorted(set(new) - {'params'})}; resume with the optimizer it was written with"
            )
        # a scheduler moves lr as it runs: compare where it started, or not at all
        compare = ["initial_lr"] if scheduled else [] if payload.get("scheduler") else ["lr"]
        compare += sorted(k for k in keys if k in old and k in new)
        if "max_momentum" in old:  # OneCycleLR cycles the momentum too
            compare = [k for k in compare if k not in _SCHEDULED_MOMENTUM]
        for key in compare:
            if key in old and key in new and not _same(old[key], new[key]):
                warnings.warn(
                    f"optimizer hyper-parameter {key!r} of group {i} changed: the checkpoint "
                    f"has {_plain(old[key])}, this run's optimizer {_plain(new[key])}; the "
                    "checkpoint's value is kept so the run resumes exactly (start a fresh run "
                    "from its weights to train with the new value)",
                    UserWarning,
                    stacklevel=outside(),
                )


def frozen_nodes(net: Any) -> dict[str, list[str]]:
    """The frozen nodes of each graph in ``net``, by the graph module's path in it (``""``:
    ``net`` itself, a ``module(g)``), for ``payload["frozen"]``."""
    from .module import GraphModule

    return {
        path: sorted(m.graph.memory.frozen)
        for path, m in net.named_modules()
        if isinstance(m, GraphModule)
    }


def check_frozen(written: Any, own: Mapping[str, Any], fresh: str) -> None:
    """The checkpoint's frozen nodes (``written``, as ``frozen_nodes`` gives them) are the
    graph's (``own``): the optimizer's state is of the trainable nodes' parameters.

    Raises:
        CheckpointError: a node frozen in one and trainable in the other, named with the
            ``g.freeze`` call that rebuilds the graph as it was trained, and ``fresh``: how
            to start a new run from the checkpoint's weights instead.
    """
    if not isinstance(written, Mapping):  # (a checkpoint from before it was kept)
        return
    thawed: list[tuple[str, str]] = []  # frozen in the checkpoint, trained here
    frozen: list[tuple[str, str]] = []  # the other way round
    for path in sorted(set(written) | set(own)):
        was, now = set(written.get(path) or ()), set(own.get(path) or ())
        thawed += [(path, n) for n in sorted(was - now)]
        frozen += [(path, n) for n in sorted(now - was)]
    if not thawed and not frozen:
        return
    said = [f"{_nodes(thawed)} frozen, which this graph trains"] if thawed else []
    said += [f"{_nodes(frozen)} trainable, which this graph freezes"] if frozen else []
    calls = [_freeze(p, n, "") for p, n in thawed] + [_freeze(p, n, ", False") for p, n in frozen]
    raise CheckpointError(
        f"the checkpoint was written with {' and '.join(said)}, so its optimizer state is of "
        f"other parameters than this run's; build the graph as it was trained "
        f"({'; '.join(calls)}) before resuming, or start a fresh run from its weights: {fresh}"
    )


def _nodes(nodes: list[tuple[str, str]]) -> str:
    named = ", ".join(f"{n!r}" + (f" (of the graph module {p!r})" if p else "") for p, n in nodes)
    return f"node{'s' if len(nodes) > 1 else ''} {named}"


def _freeze(path: str, node: str, off: str) -> str:
    return f"g.freeze({node!r}{off})" + (f" on the graph of module {path!r}" if path else "")


def _plain(v: Any) -> Any:
    return v.tolist() if isinstance(v, torch.Tensor) else v


def _same(a: Any, b: Any) -> bool:
    a, b = _plain(a), _plain(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def check_clip(payload: Mapping[str, Any], clipping: Mapping[str, float | None]) -> None:
    """Warn when the run clips gradients otherwise than the one that wrote the checkpoint
    (``clipping``: this run's ``clip_grad_norm`` and ``clip_grad_value``, by name, each
    compared with the payload's; a checkpoint from before one was kept does not compare
    it): the run goes on with its own, as a changed hyper-parameter of the optimizer warns."""
    changed = [k for k, v in clipping.items() if k in payload and payload[k] != v]
    if not changed:
        return
    then = ", ".join(f"{k}={payload[k]}" for k in changed)
    now = ", ".join(f"{k}={clipping[k]}" for k in changed)
    warnings.warn(
        f"the checkpoint was written by a run with Options({then}), this run has {now}: it "
        "goes on clipping as this run says, so it is not the run that wrote it; resume with "
        f"{then} to go on as it would have",
        UserWarning,
        stacklevel=outside(),
    )
