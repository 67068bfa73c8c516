"""The data a node's or a module's own classes hold — ``SCALE = 2``, ``MEAN =
torch.tensor(...)``, a value read from a file or the environment at import — which their
code gives only as an expression: read at every key, as part of the node's state
(``node_state.state``) or of a module's fingerprint (``somatize.torch.fingerprints``)."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .held_values import value_kind
from .node import Node
from .own_code import _own
from .user_modules import _is_user_module
from .values import digest, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["class_data", "user_classes"]

_CLASS_PLAIN = frozenset({int, float, str, bool, bytes, type(None)})
_CLASS_DATA = frozenset({tuple, list, dict, set, frozenset})
# what a class holds that is code, not data: read as the class's code (identity)
_CLASS_CODE = frozenset(
    {types.FunctionType, classmethod, staticmethod, property, type, types.MemberDescriptorType}
)
_USER_CLASSES: dict[type, tuple[tuple[type, ...], frozenset[str]]] = {}
# (a node's or module's class, one of its user classes) -> (size of its dict, _data_names)
_NAMES: dict[tuple[type, type], tuple[int, tuple[str, ...]]] = {}
# Classes kept before both are cleared: they hold the classes (whose own classes are among
# the values, so weak keys would never go), and a sweep making its node classes per run (a
# factory's `class Enc(Node)`) would otherwise keep every one, with what each holds.
_MAX_CLASSES = 1024


def class_data(cls: type, codecs: Sequence[Codec] = ()) -> str | None:
    """The data a node's (or a module's) own classes hold (``SCALE = 2``, ``MEAN =
    torch.tensor(...)``, a value read from a file or the environment at import), as a
    string, or None: the class's code gives only the expression, and ``Enc.SCALE = 5``
    changes no code. Read at every key: numbers, strings and flags by ``repr`` (which tells
    ``1``, ``1.0``, ``True`` and ``-0.0`` apart), containers of data by their digest, and
    with ``codecs`` what they fingerprint (a tensor, an array, a module: memoised by
    version counter, so an in-place write is seen as a rebinding is), and an immutable
    value no codec reads (a ``Fraction``, an ``np.float64``) by its value (``held_values``)."""
    known = _USER_CLASSES.get(cls)
    if known is None:
        if len(_USER_CLASSES) >= _MAX_CLASSES:
            _USER_CLASSES.clear()
            _NAMES.clear()
        known = _USER_CLASSES[cls] = user_classes(cls)
    mine, records = known
    found = []
    for c in mine:
        d = c.__dict__
        names = _NAMES.get((cls, c))
        if names is None or names[0] != len(d):
            names = _NAMES[cls, c] = (len(d), _data_names(d, records))
        for k in names[1]:
            v = d[k]
            t = type(v)
            if t in _CLASS_PLAIN:
                found.append((c.__qualname__, k, v))
            elif t in _CLASS_CODE:
                continue
            elif t in _CLASS_DATA and is_data(v):
                found.append((c.__qualname__, k, digest(v)))
            else:
                for codec in codecs:
                    fp = codec.fingerprint(v)
                    if fp is not None:
                        found.append((c.__qualname__, k, f"{codec.tag}:{fp}"))
                        break
                else:  # (an immutable value no codec reads: a Fraction, an np.float64)
                    how = value_kind(t)
                    if how is not None:
                        found.append((c.__qualname__, k, f"{t.__qualname__}:{digest(how(v))}"))
    return repr(found) if found else None


def _data_names(d: Mapping[str, Any], records: frozenset[str]) -> tuple[str, ...]:
    """The attributes of a class's ``__dict__`` that may hold data: not dunders, records or
    code. (Found again when the ``__dict__`` grows or shrinks; a function rebound to data
    under the same name changes the class's code, which its identity sees.)"""
    return tuple(
        k for k, v in d.items() if k[:2] != "__" and k not in records and type(v) not in _CLASS_CODE
    )


def user_classes(cls: type) -> tuple[tuple[type, ...], frozenset[str]]:
    """The user's own classes among ``cls``'s bases (itself first), and the class
    attributes their code sets or changes in place (``Enc.rows += n``, ``type(self).seen
    .append(x)``): a class's records (a counter), not its data."""
    mine = tuple(
        c for c in cls.__mro__ if c is not Node and _is_user_module(sys.modules.get(c.__module__))
    )
    owners = {f"{c.__name__}." for c in mine} | {"type(self).", "self.__class__.", "cls."}
    records = set()
    for c in mine:
        for w in _own(c)[2]:
            for owner in owners:
                if w.startswith(owner):
                    records.add(w[len(owner) :].split(".")[0])
    return mine, frozenset(records)
