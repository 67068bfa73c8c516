"""numpy's global (legacy) generator read and put back in a few µs, not ~35 each way.

``np.random.get_state()`` copies the Mersenne Twister's 624 words into a new array one
index at a time, and ``set_state`` reads them back one by one (from an array, each as a
numpy scalar): together ~70 µs of every ``fit`` (``rng.own_generators``), more than any
other part of its set-up. Here the words and their position are copied as one block,
through a numpy array over the C struct ``{uint32 key[624]; int pos}`` at the bit
generator's documented ctypes ``state_address`` (made once); the gaussian the legacy
generator may hold (``has_gauss``: the second of a pair, not in that struct) is learned
by asking for one, which the legacy stream (frozen by NEP 19) answers without drawing a
word when one is held; when none is, a pair is drawn — the words move — its held half is
taken too and the words are copied back. A state holding a gaussian is put back by
``set_state`` (words as a list: a few µs).

Checked once a process against ``get_state``/``set_state``; where anything disagrees
(another layout, no ctypes interface) those are used instead. The one difference: the
cached gaussian's value is reported as 0.0 when none is held (what numpy leaves there once
it is used), whatever a ``set_state`` put there; the draws are the same either way.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["get_numpy", "set_numpy"]

_WORDS = 624  # then the position, a C int: read as the 625th word (0 to 624, the same bits)

# [the RandomState checked, a uint32 array over its 624 words and position (no copy), or
# None where get_state is used]
_checked: list[Any] = [None, None]


def get_numpy(np: Any) -> Any:
    """``np.random.get_state(legacy=True)``: ``("MT19937", words, pos, has_gauss, gauss)``."""
    rand, at = _where(np)
    if at is None:
        return rand.get_state(legacy=True)
    return _read(np, rand, at)


def set_numpy(np: Any, state: Any) -> None:
    """``np.random.set_state(state)``, for what ``get_numpy`` (or ``get_state``) returned."""
    rand, at = _where(np)
    if at is not None and _fits(state):
        _write(rand, at, state)
        return
    if type(state) is tuple and len(state) == 5:  # (legacy MT19937's)
        # its 624 words as a list: numpy's setter reads them one index at a time, and a
        # list's int costs a fraction of an array's scalar
        kind, keys, pos, has_gauss, cached = state
        state = (kind, keys.tolist(), pos, has_gauss, cached)
    rand.set_state(state)


def _fits(state: Any) -> bool:
    """A legacy state the fast writer puts back exactly: no gaussian held (nor a value in
    its place, which only ``set_state`` writes), 624 words."""
    return (
        type(state) is tuple
        and len(state) == 5
        and state[0] == "MT19937"
        and not state[3]
        and not state[4]
        and getattr(state[1], "shape", None) == (_WORDS,)
    )


def _read(np: Any, rand: Any, at: Any) -> tuple[Any, ...]:
    raw = at.tobytes()
    words = np.frombuffer(raw, dtype=np.uint32)
    pos = int(words[_WORDS])
    words = words[:_WORDS]
    held = rand.standard_normal()  # the gaussian held, if one is: then no word is drawn
    if at.tobytes() == raw:
        rand.set_state(("MT19937", words.tolist(), pos, 1, held))  # held again, as it was
        return ("MT19937", words, pos, 1, held)
    rand.standard_normal()  # none was: a pair was drawn and its second half is held; taken
    at[:_WORDS] = words  # and the words as they were
    at[_WORDS] = pos
    return ("MT19937", words, pos, 0, 0.0)


def _write(rand: Any, at: Any, state: tuple[Any, ...]) -> None:
    before = at.tobytes()
    rand.standard_normal()  # a gaussian held is taken (no word drawn) ...
    if at.tobytes() != before:  # ... else a pair drawn, its half held: taken
        rand.standard_normal()
    at[:_WORDS] = state[1]
    at[_WORDS] = int(state[2])


def _where(np: Any) -> tuple[Any, Any]:
    rand = np.random.mtrand._rand
    if _checked[0] is not rand:
        _checked[:] = [rand, _check(np, rand)]
    return rand, _checked[1]


def _check(np: Any, rand: Any) -> Any:
    """An array over ``rand``'s words and position where reading and writing them there
    agrees with ``get_state`` and ``set_state`` (with a gaussian held and without), else None."""
    kept = rand.get_state(legacy=True)
    try:
        if type(rand._bit_generator).__name__ != "MT19937":
            return None
        address = int(rand._bit_generator.ctypes.state_address)
        if not address or ctypes.sizeof(ctypes.c_int) != 4:
            return None
        at = np.ctypeslib.as_array((ctypes.c_uint32 * (_WORDS + 1)).from_address(address))
        if at.dtype != np.uint32:
            return None
        for gauss in (False, True, False):
            if gauss:
                rand.standard_normal()  # a pair drawn: the second half held
            before = rand.get_state(legacy=True)
            got = _read(np, rand, at)
            if not (_same(got, before) and _same(rand.get_state(legacy=True), before)):
                return None
            rand.random(7)  # moved on, then put back by the fast writer where it can
            if _fits(got):
                _write(rand, at, got)
            else:
                rand.set_state((*got[:1], got[1].tolist(), *got[2:]))
            if not _same(rand.get_state(legacy=True), before):
                return None
        return at
    except Exception:  # (no ctypes interface, another bit generator: get_state it is)
        return None
    finally:
        rand.set_state(kept)


def _same(a: Any, b: Any) -> bool:
    return (
        type(a) is tuple
        and type(b) is tuple
        and len(a) == len(b) == 5
        and a[0] == b[0]
        and bool((a[1] == b[1]).all())
        and tuple(a[2:]) == tuple(b[2:])
    )
