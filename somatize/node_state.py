"""The state part of a node's key: what the node holds, as data.

``state(impl, codecs)`` is asked on every key (a frozen node's, every batch), so that
a node whose weights or settings changed is never served a stale entry:

* plain data attributes enter as they are; modules and tensors by their codec
  fingerprint (memoised by version counter, see ``somatize.torch.codecs``);
* containers item by item: list, tuple, dict, and also any mapping (``OrderedDict``),
  namedtuple, set, dataclass or ``SimpleNamespace``;
* functions, classes and bound methods by their code (``identity.fingerprint``);
* a node held by the node by its class's code and its own state;
* an instance of a class from the user's own modules (a config, a tokenizer) by its
  class's code and its attributes, each as above;
* a random generator (``random.Random``, numpy's ``Generator`` and ``RandomState``) by
  where it stands, so a node drawing from its own draws anew at every call;
* an immutable value that is no plain data (a ``Fraction``, ``Decimal``, ``complex``,
  ``Path``, date, compiled regex, numpy scalar or dtype) by its value (``held_values``);
* any other object (a library's) by the modules and tensors it holds directly and its
  plain settings; the rest of it is left to the declaration (the constructor arguments
  that made it). One of which nothing can be read (a lock, a ``deque``) enters by its
  type, and warns once that a change to it is not seen.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .bindings import Watched, still, watch
from .changes import _user_code
from .class_data import class_data
from .held_values import array_value, generator_state, scalars, value_kind
from .identity import (
    _attributes,
    _describe,
    _has_attributes,
    _is_user_module,
    _library_function,
    _warn_blind,
)
from .node import Node
from .values import digest, encode, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["Codes", "state"]


def _state_part(value: Any, codes: Codes, path: frozenset[int] = frozenset()) -> Any:
    """How one attribute of a node enters its state: data as it is, what a codec
    fingerprints (modules, tensors) by that, containers item by item, code by its
    fingerprint, a held node by its class and state."""
    if is_data(value):
        return value
    for codec in codes.codecs:
        fp = codec.fingerprint(value)
        if fp is not None:
            return {"fp": fp}
    t = type(value)
    if id(value) in path:  # containers or nodes holding each other: the first visit counts
        return {"again": t.__qualname__}
    inner = path | {id(value)}
    if t is list or t is tuple:
        return [_state_part(v, codes, inner) for v in value]
    if t is dict:
        return {str(k): _state_part(v, codes, inner) for k, v in value.items()}
    if isinstance(value, Node):  # (its class's code read once, not its identity every key)
        return {"node": codes(type(value)), "state": _state_parts(value, codes, inner)}
    return _other_part(value, codes, inner)


def _other_part(value: Any, codes: Codes, path: frozenset[int]) -> Any:
    """Containers other than list, tuple and dict; code; objects holding modules or tensors.
    Of other objects, their plain settings (``scalars``); the rest is left to the
    declaration (the constructor arguments that made them)."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, Mapping):  # OrderedDict, ModuleDict-like mappings...
        items = [
            [_state_part(k, codes, path), _state_part(v, codes, path)] for k, v in value.items()
        ]
        return {"type": kind, "items": items}
    if isinstance(value, (list, tuple)):  # a namedtuple, torch.Size, a list subclass
        return {"type": kind, "items": [_state_part(v, codes, path) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"type": kind, "items": sorted(digest(_state_part(v, codes, path)) for v in value)}
    if isinstance(value, functools.partial):
        return {
            "partial": _state_part(value.func, codes, path),
            "args": _state_part(list(value.args), codes, path),
            "kwargs": _state_part(dict(value.keywords), codes, path),
        }
    if isinstance(value, types.MethodType):
        return {"method": codes(value.__func__), "of": _state_part(value.__self__, codes, path)}
    if (
        isinstance(value, types.BuiltinFunctionType)
        and not isinstance(value.__self__, (types.ModuleType, type, type(None)))
        and generator_state(value.__self__) is None  # (random.random: a draw, by name)
    ):  # a builtin method bound to its object ("{}-x".format, d.get, t.mul): the object too
        return {"builtin": value.__qualname__, "of": _state_part(value.__self__, codes, path)}
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return {"code": codes(value)}
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
            "fields": {k: _state_part(v, codes, path) for k, v in fields.items()},
        }
    how = value_kind(type(value))
    if how is not None:  # an immutable value (a Fraction, a Decimal, a complex, a Path)
        return {"type": kind, "value": how(value)}
    array = array_value(value)
    if array is not None:  # (a numpy array, where no codec of the graph's reads it)
        return {"type": kind, "array": array}
    drawn = generator_state(value)
    if drawn is not None:  # a generator of its own: where it stands, as a torch.Generator's
        return {"type": kind, "draws": drawn}
    if _has_attributes(value) and _is_user_module(sys.modules.get(type(value).__module__)):
        # an instance of the user's own class: a change to any of its attributes is seen
        attrs = sorted(_attributes(value).items())
        return {
            "type": kind,
            "code": codes(type(value)),
            "attrs": {k: _state_part(v, codes, path) for k, v in attrs},
        }
    held = {}  # a library's object: the modules and tensors it holds, one level down
    for name, v in getattr(value, "__dict__", {}).items():
        for codec in codes.codecs:
            fp = codec.fingerprint(v)
            if fp is not None:
                held[name] = fp
                break
    plain = scalars(value)  # and its plain settings (a config's flags and sizes)
    if plain:
        return {"type": kind, "holds": held, "plain": [list(p) for p in plain]}
    if held:
        return {"type": kind, "holds": held}
    named = _library_function(value)
    if named is not None:  # numpy's ufuncs, Cython functions, str.lower: by name
        return {"lib": named}
    # nothing of it can be read (a lock, a deque, a library's C object): by its type, and
    # said once, as for an object a node's code reads
    _warn_blind(codes.owner, f"a {kind}", "holds", codes.what)
    return "obj:" + kind


class Codes:
    """How the functions, methods and node classes a node holds enter its state: by their
    code and by what that code reads (globals and closure variables; tensors, arrays and
    modules by content, through the codecs).

    The code is read once per ``Codes`` — one per graph's keys (``NodeKeys``), as a node
    class's own code is — and the names it reads are checked at every key: a global
    rebound later (a helper redefined) is read again (``bindings.py``). The tensors,
    arrays and modules it was found to read are asked for their fingerprints again on
    every key (memoised by version counter: a walk, not a hash), so a new checkpoint loaded
    into a module a held function reads, or an in-place write to a tensor it reads, is
    seen at once. What enters by type alone (a lock, a library object) warns once,
    naming the node and the function.
    """

    def __init__(self, codecs: Sequence[Codec] = (), *, warn: bool = True) -> None:
        self.codecs = tuple(codecs)
        self.warn = warn  # (False: no node to name, as for what a module holds)
        self.owner: type = object  # the class of the node whose state is being read
        self.what = "node class"  # what the owner is, as a warning names it
        # obj -> (description, [(what it reads, its codec, fingerprint then)], the names
        # its code reads, bound as then)
        self._known: weakref.WeakKeyDictionary[Any, tuple[str, list[Any], Watched]] = (
            weakref.WeakKeyDictionary()
        )
        self._strong: dict[
            int, tuple[Any, tuple[str, list[Any], Watched]]
        ] = {}  # (no weak reference)
        # a node -> (itself, weakly; its state's parts when exact to compare; the state
        # they made): the same parts again are not encoded again (``state``)
        self._states: dict[int, tuple[weakref.ref[Any], dict[str, Any], str]] = {}

    def __call__(self, obj: Any) -> str:
        weak = _weak(obj)
        known = self._known.get(obj) if weak else self._strong.get(id(obj), (None, None))[1]
        if (
            known is not None
            and all(c.fingerprint(o) == fp for o, c, fp in known[1])
            and (not known[2] or still(known[2]))
        ):
            return known[0]
        reads = _Reads(self.codecs)
        blind: list[str] = []
        described = _describe(obj, {}, (reads,), blind)
        if known is None and self.warn:  # (warned when first read)
            for where in blind:
                _warn_held(self.owner, obj, where)
        # the names a user function or class reads, bound as now (bindings.py)
        names = watch(obj, ()) if _user_code(obj) else []
        if weak:
            self._known[obj] = (described, reads.read, names)
        else:
            self._strong[id(obj)] = (obj, (described, reads.read, names))
        return described


class _Reads:
    """The codecs, seen by ``identity._describe`` as one codec that takes no value as data
    (so that a tensor or array is described by its fingerprint, as a module is) and keeps
    what it fingerprinted: what the code read whose content can change in place."""

    tag = "somatize.reads"

    def __init__(self, codecs: Sequence[Codec]) -> None:
        self.codecs = codecs
        self.read: list[tuple[Any, Codec, str]] = []

    def accepts(self, value: Any) -> bool:
        return False

    def check(self, value: Any) -> None:  # (never asked: it accepts nothing)
        raise TypeError(f"{self.tag} encodes nothing")

    def chunks(self, value: Any) -> Iterable[bytes | memoryview]:
        raise TypeError(f"{self.tag} encodes nothing")

    def decode(self, payload: bytes) -> Any:
        raise TypeError(f"{self.tag} decodes nothing")

    def fingerprint(self, obj: Any) -> str | None:
        for codec in self.codecs:
            fp = codec.fingerprint(obj)
            if fp is not None:
                self.read.append((obj, codec, fp))
                return fp
        return None


def _weak(obj: Any) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


def _warn_held(cls: type, obj: Any, where: str) -> None:
    name = getattr(obj, "__qualname__", type(obj).__qualname__)
    _warn_blind(cls, where.removeprefix(" → "), f"holds {name!r}, whose code reads the global")


def _state_parts(impl: Any, codes: Codes, path: frozenset[int]) -> dict[str, Any]:
    return {
        name: _state_part(value, codes, path)
        for name, value in vars(impl).items()
        if not name.startswith("_somatize")
    }


def state(
    impl: Any, codecs: Sequence[Codec] = (), context: Any = None, codes: Codes | None = None
) -> str:
    """The state part of a node's key: its data attributes and codec-fingerprinted holdings,
    and the codecs' ``context`` when there is one (torch: the autocast dtype). ``codes``
    holds the code already read (see ``Codes``); without it, code is read afresh."""
    if codes is None:
        codes = Codes(codecs)
    codes.owner = type(impl)
    parts = _state_parts(impl, codes, frozenset({id(impl)}))
    held = class_data(type(impl), codes.codecs)
    if held is not None:
        parts["_somatize_class"] = held
    if context is not None:
        parts["_somatize_context"] = context  # (no attribute has that name: they are skipped)
    last = codes._states.get(id(impl))
    if last is not None and last[0]() is impl and _same(parts, last[1]):
        return last[2]  # (the parts of last time, type for type: not encoded again)
    result = blake3(encode(parts)).hexdigest()
    kept = _exact_copy(parts)
    if kept is not None and _weak(impl):
        if len(codes._states) > 1024:
            codes._states.clear()
        codes._states[id(impl)] = (weakref.ref(impl), kept, result)
    return result


_EXACT = frozenset({str, int, bool, type(None)})  # (== is exact within each of these types)


def _exact_copy(parts: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of ``parts`` when each is a string, an int, a bool, None, a codec's
    ``{"fp": str}`` or the codecs' context (tuples of strings), else None: what a later
    ``state`` can match by ``_same`` instead of encoding its parts again (a frozen
    module's state is asked at every batch). Floats are left out: ``0.0 == -0.0``, and
    containers, which may be the node's own and change in place."""
    kept: dict[str, Any] = {}
    for name, v in parts.items():
        t = type(v)
        if t in _EXACT:
            kept[name] = v
        elif t is dict and len(v) == 1 and type(v.get("fp")) is str:
            kept[name] = {"fp": v["fp"]}  # (a copy: the part may be the node's own dict)
        elif name == "_somatize_context" and _strings(v):
            kept[name] = v
        else:
            return None
    return kept


def _strings(v: Any) -> bool:
    """Whether ``v`` is a string, or a tuple of such tuples and strings (immutable)."""
    return type(v) is str or (type(v) is tuple and all(_strings(x) for x in v))


def _same(parts: dict[str, Any], kept: dict[str, Any]) -> bool:
    """Whether ``parts`` are what ``kept`` (``_exact_copy``) holds, type for type."""
    if len(parts) != len(kept):
        return False
    for name, v in parts.items():
        k = kept.get(name, _same)  # (a name not kept: a function, never a part's type)
        t = type(v)
        if t is not type(k):
            return False
        if t is dict:
            if len(v) != 1 or type(v.get("fp")) is not str or v["fp"] != k["fp"]:
                return False
        elif not (t in _EXACT or _strings(v)) or v != k:
            return False
    return True
