"""A cached node whose forward draws random numbers: warned once, naming it.

A cached node's output is remembered from the call that computed it, so noise drawn in
its ``forward`` (``torch.randn``, dropout in training mode, a random transform) is drawn
once and served ever after, where plain PyTorch draws anew at every call. The graph's
runtime (``frozen.py``) wraps a cached node's forward — which runs only on a miss — in
``Drawing``: torch's generators are read before and after it (the CPU one's state, a few
µs; the offset of each CUDA one started), and a change says the node drew.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..node import Ctx, Done
from ..stack import outside

__all__ = ["Drawing"]

_cpu = torch.default_generator
_warned: set[tuple[str, str]] = set()


def _marks() -> tuple[Any, ...]:
    """Where torch's generators stand: the CPU one's state, each started CUDA one's offset."""
    cpu = _cpu.get_state().numpy().tobytes()
    if not torch.cuda.is_initialized():
        return (cpu,)
    return (cpu, *(_offset(g) for g in torch.cuda.default_generators))


def _offset(g: torch.Generator) -> Any:
    """A CUDA generator's Philox offset (its whole state where a build has no offset)."""
    try:
        return g.get_offset()
    except (AttributeError, RuntimeError):
        return g.get_state().numpy().tobytes()


class Drawing:
    """A cached node's forward, watched for random draws (a class: graphs stay picklable)."""

    __slots__ = ("forward", "impl", "node_id")

    def __init__(self, node_id: str, impl: Any, forward: Callable[[Any, Ctx], Done]) -> None:
        self.node_id, self.impl, self.forward = node_id, impl, forward

    def __call__(self, x: Any, ctx: Ctx) -> Done:
        cls = type(self.impl).__qualname__
        if (self.node_id, cls) in _warned:
            return self.forward(x, ctx)
        before = _marks()
        done = self.forward(x, ctx)
        if _marks() != before:
            _warn(self.node_id, cls)
        return done


def _warn(node_id: str, cls: str) -> None:
    _warned.add((node_id, cls))
    warnings.warn(
        f"node {node_id!r} ({cls}) is cached but drew random numbers in its forward "
        "(torch.randn, dropout in training mode, a random transform): its output is "
        "remembered from the call that computed it, so every later call is served that one "
        "draw, where plain PyTorch draws anew. Move the randomness out of the cached node "
        "(into a node after it, or an uncached one before it), freeze it (eval mode: no "
        "dropout), or stop caching it",
        UserWarning,
        stacklevel=outside(),
    )
