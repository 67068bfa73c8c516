"""How a node was *made*: its constructor arguments, bound to parameter names with
defaults applied, canonicalised the first time a key is needed (one of the parts of a
node's key, beside its identity, ``identity.py``, and its state, ``node_state.py``)."""

from __future__ import annotations

import enum
import functools
import inspect
import os
import sys
import types
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import DeclarationError
from .identity import (
    _describe,
    _has_attributes,
    _is_user_module,
    _library_function,
    _warn_blind,
    identity,
)
from .node import Node
from .values import digest, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["declaration"]


def _declare(value: Any, where: str, codecs: Sequence[Codec], blind: list[tuple[Any, str]]) -> Any:
    """How one constructor argument enters the declaration; what a function argument's code
    reads and the key cannot see is added to ``blind`` as (function, where)."""
    t = type(value)
    if t is list or t is tuple:
        return t(_declare(v, f"{where}[{i}]", codecs, blind) for i, v in enumerate(value))
    if t is dict:
        for k in value:
            if type(k) is not str and type(k) is not int:
                raise DeclarationError(
                    f"argument {where} has a dict key {k!r} of type {type(k).__qualname__}, "
                    "which cannot be written into a key; use str or int keys, "
                    "or do not cache this node"
                )
        return {k: _declare(v, f"{where}[{k!r}]", codecs, blind) for k, v in value.items()}
    if is_data(value, codecs):
        return value
    if isinstance(value, Node):
        return {"node": identity(value, codecs), "args": declaration(value, codecs)}
    if isinstance(value, (types.FunctionType, type)):  # its code, and what it reads by content
        inner: list[str] = []
        described = _describe(value, {}, codecs, inner)
        blind.extend((value, w) for w in inner)
        return {"code": described}
    if isinstance(value, (types.BuiltinFunctionType, types.ModuleType)):
        return {"lib": _describe(value, {}, codecs)}  # (a bound builtin: its object too)
    named = _library_function(value)
    if named is not None:  # a builtin type's method (torch.Tensor.relu), a numpy ufunc
        return {"lib": named}
    if isinstance(value, functools.partial):
        return {
            "partial": _declare(value.func, f"{where}.func", codecs, blind),
            "args": _declare(list(value.args), f"{where}.args", codecs, blind),
            "kwargs": _declare(dict(value.keywords), f"{where}.keywords", codecs, blind),
        }
    for codec in codecs:
        fp = codec.fingerprint(value)
        if fp is not None:
            return {"state": fp}
    if isinstance(value, enum.Enum) or (
        _has_attributes(value) and _is_user_module(sys.modules.get(t.__module__))
    ):  # an enum member; a dataclass or other instance of the user's own class (a config)
        inner = []
        described = _describe(value, {}, codecs, inner)
        unseen = [w for w in inner if not w.startswith(" → ")]  # (not what its code reads)
        if unseen:
            raise DeclarationError(
                f"argument {where} is a {t.__qualname__} whose attribute {unseen[0].strip()} "
                "cannot be written into a key; make that attribute plain data, pass it as an "
                "argument of its own, or do not cache this node"
            )
        blind.extend((t, w) for w in inner)
        return {"object": described}
    library = _library(value, where, codecs, blind)
    if library is not None:
        return library
    if isinstance(value, os.PathLike):
        raise DeclarationError(
            f"argument {where} is a path ({value!r}), and a key made of a path would not "
            "follow the file's content: read the file in a node before this one (what it "
            "returns is keyed by content), or pass str(path) if only the name matters"
        )
    raise DeclarationError(
        f"argument {where} is a {type(value).__qualname__}, which cannot be written into a key; "
        "pass plain data (numbers, str, lists, dicts), a Node, a function or a tensor instead, "
        "or do not cache this node"
    )


def _library(value: Any, where: str, codecs: Sequence[Codec], blind: list[tuple[Any, str]]) -> Any:
    """A value of a standard or library type whose content says all it is, declared with
    its type's name (``torch.Size([3, 4])`` is not ``(3, 4)``), or None: a tuple type
    (``torch.Size``; a namedtuple of the user's own is an object, above), an
    ``OrderedDict`` (its order kept), a set (its items in the order of their keys),
    a ``range``, a ``complex``."""
    t = type(value)
    kind = f"{t.__module__}.{t.__qualname__}"
    if isinstance(value, tuple):
        return {kind: [_declare(v, f"{where}[{i}]", codecs, blind) for i, v in enumerate(value)]}
    if t is OrderedDict:
        plain = _declare(dict(value), where, codecs, blind)  # (its keys checked there)
        return {kind: [[k, plain[k]] for k in value]}
    if t is set or t is frozenset:
        items = [_declare(v, f"{where} item {v!r:.40}", codecs, blind) for v in value]
        return {kind: sorted(items, key=lambda v: digest(v, codecs, where=where))}
    if t is range:
        return {kind: [value.start, value.stop, value.step]}
    if t is complex:
        return {kind: [value.real, value.imag]}
    return None


def declaration(impl: Any, codecs: Sequence[Codec] = ()) -> str:
    """The declaration part of a node's key: its bound constructor arguments, as a digest.

    Computed once per node, the first time a key is needed.

    Raises:
        DeclarationError: an argument is neither data nor something with a fingerprint.
    """
    cached = impl.__dict__.get("_somatize_decl")
    if cached is not None:
        return str(cached)
    args, kwargs = impl.__dict__.get("_somatize_args", ((), {}))
    cls = type(impl)
    if cls.__init__ is object.__init__:
        bound: dict[str, Any] = {}
    else:
        sig = inspect.signature(cls.__init__)
        ba = sig.bind(impl, *args, **kwargs)
        ba.apply_defaults()
        bound = dict(list(ba.arguments.items())[1:])
    blind: list[tuple[Any, str]] = []
    declared = {
        k: _declare(v, f"{k!r} of {cls.__qualname__}", codecs, blind) for k, v in bound.items()
    }
    for fn, where in blind:
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        _warn_blind(
            cls, where.removeprefix(" → "), f"is given {name!r}, whose code reads the global"
        )
    result = digest(declared, codecs, where=f"the arguments of {cls.__qualname__}")
    impl.__dict__["_somatize_decl"] = result
    return result
