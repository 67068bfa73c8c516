"""How objects that are neither plain data nor code enter a node's state (``node_state``)
by what can be read of them: an immutable value by its value, a random generator by where
it stands, a library's object by its plain settings.
"""

from __future__ import annotations

import contextlib
import random
import re
import sys
from collections.abc import Callable
from typing import Any

from .values import digest, is_data

__all__ = ["array_value", "generator_state", "scalars", "value_kind"]


_UNSEEN: Any = object()
# a type -> how its values enter a state (value_kind), or None: found once per type
_KINDS: dict[type, Callable[[Any], Any] | None] = {}
# immutable values, by their repr: (module, class names), read where the module is loaded
_BY_REPR = (
    ("builtins", ("complex", "range")),
    ("fractions", ("Fraction",)),
    ("decimal", ("Decimal",)),
    ("datetime", ("date", "time", "timedelta", "timezone")),
    ("pathlib", ("PurePath",)),
    ("uuid", ("UUID",)),
)


def value_kind(t: type) -> Callable[[Any], Any] | None:
    """How a value of type ``t`` that is immutable and no plain data enters a state, by
    value: a ``Fraction``, ``Decimal``, ``complex``, date, ``Path`` or ``UUID`` by its repr
    (which is its value: ``Decimal('0.50')``), a compiled regex by its pattern and flags,
    a numpy scalar (where no numpy codec reads it) by its dtype and bytes, a numpy dtype by
    its repr; None for any other type. (A value of a module not imported cannot exist: the
    module is looked up, never imported.)"""
    how = _KINDS.get(t, _UNSEEN)
    if how is _UNSEEN:
        how = _find_kind(t)
        if len(_KINDS) < 4096:
            _KINDS[t] = how
    return how  # type: ignore[no-any-return]


def array_value(value: Any) -> list[Any] | None:
    """A numpy array's dtype, shape and bytes, read afresh (it can be written in place),
    where no numpy codec reads it (a graph without ``somatize.torch``'s codecs); None for
    anything else, and for an array of Python objects (its bytes are addresses)."""
    np = sys.modules.get("numpy")
    if np is None or not isinstance(value, np.ndarray) or value.dtype.hasobject:
        return None
    return [value.dtype.str, list(value.shape), np.ascontiguousarray(value).tobytes()]


def _find_kind(t: type) -> Callable[[Any], Any] | None:
    for module, names in _BY_REPR:
        found = sys.modules.get(module)
        if found is not None and issubclass(t, tuple(getattr(found, n) for n in names)):
            return repr
    if issubclass(t, re.Pattern):
        return lambda p: [p.pattern, p.flags]
    np = sys.modules.get("numpy")
    if np is not None:
        if issubclass(t, np.dtype):
            return repr  # (dtype('float32'), its fields for a structured one)
        scalars = (np.number, np.bool_, np.str_, np.bytes_, np.datetime64, np.timedelta64)
        if issubclass(t, scalars):
            return lambda v: [v.dtype.str, v.tobytes()]
    return None


def generator_state(value: Any) -> str | None:
    """The digest of where a random generator stands — Python's ``random.Random``, numpy's
    ``Generator``, ``RandomState`` or bit generator —, None for anything else. A node
    augmenting with a generator of its own then draws anew at every call (its key moves
    with each draw), and a node seeded alike elsewhere finds the same entries."""
    if isinstance(value, random.Random):
        with contextlib.suppress(NotImplementedError):  # (SystemRandom keeps no state)
            return digest(value.getstate())
        return None
    if not type(value).__module__.startswith("numpy.random"):
        return None
    with contextlib.suppress(Exception):  # (a numpy object of another kind: not a generator)
        held = getattr(value, "bit_generator", value)  # a Generator, or a bit generator
        state = held.get_state(legacy=False) if hasattr(held, "get_state") else held.state
        return digest(_plain_state(state))
    return None


def _plain_state(value: Any) -> Any:
    """A generator's state as data: its arrays (a RandomState's key) as their bytes."""
    if isinstance(value, dict):
        return {str(k): _plain_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_state(v) for v in value]
    tobytes = getattr(value, "tobytes", None)
    if tobytes is not None and not isinstance(value, (int, float, str, bytes)):
        return [str(getattr(value, "dtype", "")), tobytes()]
    return value if is_data(value) else repr(value)


_SCALARS = frozenset({int, float, bool, str, type(None)})


def scalars(obj: Any) -> list[tuple[str, Any]]:
    """The attributes of a library's object that are numbers, strings, flags or None — a
    HuggingFace config's ``output_hidden_states``, ``hidden_size`` —, by name: what of it
    is read cheaply at every key (its containers and other objects are left to what
    built it)."""
    found = getattr(obj, "__dict__", None)
    if not found:
        return []
    return sorted((k, v) for k, v in found.items() if type(v) in _SCALARS)
