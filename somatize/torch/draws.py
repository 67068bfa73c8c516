"""Random draws in a node's forward: a cached node warned once, a node keying one keyed by content.

Whether a forward drew is read off the global generators before and after it: torch's CPU
one's state, the offset of each CUDA one started, Python's ``random`` and numpy's (about
4 µs of CPU); a change says the node drew.

* A cached node's output is remembered from the call that computed it, so noise drawn in
  its ``forward`` (``torch.randn``, dropout in training mode, a random transform) is drawn
  once and served ever after, where plain PyTorch draws anew at every call. The graph's
  runtime (``frozen.py``) wraps a cached node's forward — which runs only on a miss — in
  ``Drawing``, which warns once, naming it.
* An uncached node whose key feeds a cached or named node's key (a random augmentation
  before a cached encoder) would give a recipe key that repeats for different outputs.
  The keyed walk runs its forward through the runtime's ``draws`` (``drawn`` here), and
  when it drew, keys it by the content of its output (``somatize/drawn.py``).

A generator the node holds (``self.gen = torch.Generator()``) is part of its state, so it
enters its key instead: read before the forward, the key moves with each draw, and
repeats only where the generator's state does (seeded alike), where the draw repeats too.
"""

from __future__ import annotations

import ctypes
import random
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..node import Ctx, Done
from ..stack import outside

__all__ = ["Drawing", "drawn"]

_cpu = torch.default_generator
_U32, _INT = ctypes.c_uint32, ctypes.c_int
_warned: set[tuple[str, str]] = set()


def _marks() -> tuple[Any, ...]:
    """Where the global generators stand: torch's CPU one's state, each started CUDA one's
    offset, Python's ``random`` and numpy's global one (augmentation libraries draw there)."""
    marks: list[Any] = [_cpu.get_state().numpy().tobytes(), _python()]
    np = sys.modules.get("numpy")
    if np is not None:
        marks.append(_numpy(np))
    if torch.cuda.is_initialized():
        marks += [_offset(g) for g in torch.cuda.default_generators]
    return tuple(marks)


_RANDOM_AT: list[int | None] = []  # where the global random.Random's words lie, once checked


def _python() -> Any:
    """Where Python's global ``random`` stands: its Mersenne Twister's position and first
    and last state words, read where they lie, and ``gauss_next`` (1 µs; ``getstate()``
    makes 625 ints: 8). A position back where it was after 624 words drawn comes with
    a regenerated state, so its first word moved."""
    inst = random._inst  # type: ignore[attr-defined]  # (what random.random etc. are bound to)
    if not _RANDOM_AT:
        _RANDOM_AT.append(_random_layout(inst))
    at = _RANDOM_AT[0]
    if at is None or type(inst) is not random.Random:
        return random.getstate()
    at += id(inst)  # struct { PyObject_HEAD; int index; uint32_t state[624]; }
    return (
        id(inst),
        _INT.from_address(at).value,
        _U32.from_address(at + 4).value,
        _U32.from_address(at + 4 + 623 * 4).value,
        inst.gauss_next,  # type: ignore[attr-defined]  # (random.gauss: a draw held for later)
    )


def _random_layout(inst: random.Random) -> int | None:
    """The offset of a CPython ``random.Random``'s ``index`` (its state words follow),
    checked against ``getstate()``; None where it does not hold (another Python)."""
    if sys.implementation.name != "cpython" or type(inst) is not random.Random:
        return None
    at = object.__basicsize__  # (PyObject_HEAD)
    try:
        words = inst.getstate()[1]
        base = id(inst) + at
        index = _INT.from_address(base).value
        first, last = _U32.from_address(base + 4).value, _U32.from_address(base + 4 * 624).value
    except Exception:
        return None
    return at if (first, last, index) == (words[0], words[623], words[624]) else None


# id of numpy's global MT19937 -> it, its state's address: the one in use alone (a generator
# swapped in by np.random.set_bit_generator replaces the last, which is not kept alive)
_numpy_states: dict[int, tuple[Any, int]] = {}


def _numpy(np: Any) -> Any:
    """Where numpy's global generator stands: its Mersenne Twister's first key word and
    position, read where they lie (1 µs; the public ``get_state`` copies it all: 35 µs)."""
    try:
        bg = np.random.get_bit_generator()
        known = _numpy_states.get(id(bg))
        if known is None or known[0] is not bg:
            if type(bg).__name__ != "MT19937":
                raise TypeError  # (another bit generator: its state as numpy gives it)
            _numpy_states.clear()
            known = _numpy_states[id(bg)] = (bg, bg.ctypes.state_address)
        at = known[1]  # struct { uint32 key[624]; int pos; ... }
        return (id(bg), _U32.from_address(at).value, _INT.from_address(at + 2496).value)
    except Exception:
        return repr(np.random.get_state(legacy=False))


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


def drawn(forward: Callable[[Any, Ctx], Any], x: Any, ctx: Ctx) -> tuple[Any, bool]:
    """``forward(x, ctx)``, and whether it drew from a global generator: the runtime's
    ``draws`` hook, through which the keyed walk runs a node whose key feeds a cached or
    named node's key (``somatize/drawn.py``)."""
    before = _marks()
    result = forward(x, ctx)
    return result, _marks() != before


def _warn(node_id: str, cls: str) -> None:
    _warned.add((node_id, cls))
    warnings.warn(
        f"node {node_id!r} ({cls}) is cached but drew random numbers in its forward "
        "(torch.randn, dropout in training mode, a random transform, random or np.random): "
        "its output is "
        "remembered from the call that computed it, so every later call is served that one "
        "draw, where plain PyTorch draws anew. Move the randomness out of the cached node "
        "(into a node after it, or an uncached one before it), freeze it (eval mode: no "
        "dropout), or stop caching it",
        UserWarning,
        stacklevel=outside(),
    )
