"""The state part of a node's key: what the node holds, as data.

``state(impl, codecs)`` is asked on every key (a frozen node's, every batch), so that
a node whose weights or settings changed is never served a stale entry:

* plain data attributes enter as they are; modules and tensors by their codec
  fingerprint (memoised by version counter, see ``somatize.torch.codecs``);
* containers item by item: list, tuple, dict, and also any mapping (``OrderedDict``),
  namedtuple, set, dataclass or ``SimpleNamespace``;
* functions, classes and bound methods by their code (``identity.fingerprint``);
* a node held by the node by its class's code and its own state;
* any other object by the modules and tensors it holds directly; the rest of it is left
  to the declaration (the constructor arguments that made it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .identity import _describe
from .node import Node
from .values import digest, encode, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["state"]


def _state_part(value: Any, codecs: Sequence[Codec], path: frozenset[int] = frozenset()) -> Any:
    """How one attribute of a node enters its state: data as it is, what a codec
    fingerprints (modules, tensors) by that, containers item by item, code by its
    fingerprint, a held node by its class and state."""
    if is_data(value):
        return value
    for codec in codecs:
        fp = codec.fingerprint(value)
        if fp is not None:
            return {"fp": fp}
    t = type(value)
    if id(value) in path:  # containers or nodes holding each other: the first visit counts
        return {"again": t.__qualname__}
    inner = path | {id(value)}
    if t is list or t is tuple:
        return [_state_part(v, codecs, inner) for v in value]
    if t is dict:
        return {str(k): _state_part(v, codecs, inner) for k, v in value.items()}
    if isinstance(value, Node):  # (its class's code read once, not its identity every key)
        return {"node": _code(type(value)), "state": _state_parts(value, codecs, inner)}
    return _other_part(value, codecs, inner)


def _other_part(value: Any, codecs: Sequence[Codec], path: frozenset[int]) -> Any:
    """Containers other than list, tuple and dict; code; objects holding modules or tensors.
    Other objects are left to the declaration (the constructor arguments that made them)."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, Mapping):  # OrderedDict, ModuleDict-like mappings...
        items = [
            [_state_part(k, codecs, path), _state_part(v, codecs, path)] for k, v in value.items()
        ]
        return {"type": kind, "items": items}
    if isinstance(value, (list, tuple)):  # a namedtuple, torch.Size, a list subclass
        return {"type": kind, "items": [_state_part(v, codecs, path) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"type": kind, "items": sorted(digest(_state_part(v, codecs, path)) for v in value)}
    if isinstance(value, functools.partial):
        return {
            "partial": _state_part(value.func, codecs, path),
            "args": _state_part(list(value.args), codecs, path),
            "kwargs": _state_part(dict(value.keywords), codecs, path),
        }
    if isinstance(value, types.MethodType):
        return {"method": _code(value.__func__), "of": _state_part(value.__self__, codecs, path)}
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return {"code": _code(value)}
    if isinstance(value, types.SimpleNamespace) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        fields = (
            {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            if dataclasses.is_dataclass(value)
            else vars(value)
        )
        return {
            "type": kind,
            "fields": {k: _state_part(v, codecs, path) for k, v in fields.items()},
        }
    held = {}  # any other object: the modules and tensors it holds, one level down
    for name, v in getattr(value, "__dict__", {}).items():
        for codec in codecs:
            fp = codec.fingerprint(v)
            if fp is not None:
                held[name] = fp
                break
    return {"type": kind, "holds": held} if held else None


# How a function or class attribute enters a state, by the object (its code is read once).
_codes: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _code(obj: Any) -> str:
    known = _codes.get(obj)
    if known is None:
        known = _describe(obj, {})
        with contextlib.suppress(TypeError):  # (builtins take no weak reference)
            _codes[obj] = known
    return known


def _state_parts(impl: Any, codecs: Sequence[Codec], path: frozenset[int]) -> dict[str, Any]:
    return {
        name: _state_part(value, codecs, path)
        for name, value in vars(impl).items()
        if not name.startswith("_somatize")
    }


def state(impl: Any, codecs: Sequence[Codec] = (), context: Any = None) -> str:
    """The state part of a node's key: its data attributes and codec-fingerprinted holdings,
    and the codecs' ``context`` when there is one (torch: the autocast dtype)."""
    parts = _state_parts(impl, codecs, frozenset({id(impl)}))
    if context is not None:
        parts["_somatize_context"] = context  # (no attribute has that name: they are skipped)
    return blake3(encode(parts)).hexdigest()
