"""What a node *is* (identity), beside how it was *made* (declaration, ``declaration.py``)
and what it *holds* (state, ``node_state.py``): three of the four parts of a node's key
(the fourth: its predecessors' keys).

* identity — the qualified class name plus a fingerprint of its code: the AST with
  docstrings and comments removed, *and* the code of every helper function or class
  from the user's own modules it references, transitively (site-packages and the
  standard library enter by name; the somatize and torch versions enter too). The globals
  that code reads enter by content where they can (data, a ``functools.partial``, an
  instance of a user class); one that enters by type alone makes a warning.
* declaration — the constructor arguments, bound to parameter names with defaults
  applied, canonicalised the first time a key is needed.
* state — what the node holds that changes its output: plain-data attributes, and
  objects a codec fingerprints (module weights, tensors).
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import importlib.metadata
import logging
import os
import random
import re
import sys
import sysconfig
import types
import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .source_code import (
    code_digest,
    code_names,
    functions,
    referenced,
    source_tree,
    strip_docstrings,
    written,
)
from .stack import outside
from .values import digest, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["fingerprint", "identity"]

# The code of each class or function, read once: (digest of it, dotted names it reads,
# names it changes in place).
# Only an object's own code is kept here: what its names resolve to is looked up on
# every fingerprint, since a helper module may be reloaded under an unchanged class.
_sources: weakref.WeakKeyDictionary[Any, tuple[bytes, list[list[str]], frozenset[str]]] = (
    weakref.WeakKeyDictionary()
)


@functools.cache
def _versions() -> str:
    parts = []
    for dist in ("somatize", "torch"):
        try:
            parts.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist}=none")
    return " ".join(parts)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    roots.add(os.path.dirname(os.path.abspath(__file__)))  # somatize itself: enters by version
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def _is_user_module(module: types.ModuleType | None) -> bool:
    if module is None:
        return False
    file = getattr(module, "__file__", None)
    if file is None:
        return module.__name__ == "__main__"
    return not _in_library(file)


@functools.lru_cache(maxsize=8192)
def _in_library(file: str) -> bool:
    """Whether a module's file lies under the standard library, site-packages or somatize
    (kept per path: ``realpath`` costs six ``lstat`` calls, and keys ask at every miss)."""
    return os.path.realpath(file).startswith(_library_roots())


def _describe(
    obj: Any, memo: dict[int, str], codecs: Sequence[Codec] = (), blind: list[str] | None = None
) -> str:
    """How a referenced global enters a fingerprint: user code by its fingerprint, library
    code by name, data by content (with ``codecs``, tensors, arrays and modules too), a
    ``functools.partial`` by its function and arguments, an instance of the user's own
    class by its class's code and its attributes, and anything else by its type alone.

    What enters by type alone is what the key cannot see change; where it sits is added
    to ``blind``: ``" (a Lock)"`` for ``obj`` itself, ``".attr (a Lock)"`` for a part of it,
    ``" → TOK (a Tok)"`` for what a helper it calls reads.
    """
    if isinstance(obj, (types.FunctionType, type)) and _is_user_module(
        sys.modules.get(obj.__module__)
    ):
        inner: list[str] = []
        result = "code:" + _fingerprint(obj, memo, codecs, inner)
        if blind is not None:
            blind.extend(" → " + where for where in inner)  # `helper → TOK (a Tok)`
        return result
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)):
        name = getattr(obj, "__qualname__", None) or obj.__name__
        described = f"lib:{getattr(obj, '__module__', '') or ''}.{name}"
        owner = getattr(obj, "__self__", None)
        if (
            owner is None
            or isinstance(owner, (types.ModuleType, type, random.Random))
            or type(owner).__module__.startswith("numpy.random")
        ):  # (random.random, np.random.rand: a global generator's draws, by name)
            return described
        # a builtin method bound to its object ("b-{}".format, t.mul, d.get): the object too
        inner = []
        described += "@" + _describe(owner, memo, codecs, inner)
        if blind is not None:
            blind.extend(".__self__" + where for where in inner)
        return described
    named = _library_function(obj)
    if named is not None:  # numpy's ufuncs and dispatchers, Cython functions: by name too
        return "lib:" + named
    if is_data(obj):
        return "data:" + digest(obj)
    if codecs and is_data(obj, codecs):  # a global tensor or array (normalising constants)
        return "data:" + digest(obj, codecs)
    for codec in codecs:  # a global module (its weights), a dtype or a device
        fp = codec.fingerprint(obj)
        if fp is not None:
            return "state:" + fp
    known = memo.get(id(obj))
    if known is not None:  # seen in this fingerprint already, or an object holding itself
        return known
    memo[id(obj)] = "cycle:" + type(obj).__qualname__
    seen: list[str] = []
    try:
        result = _describe_object(obj, memo, codecs, seen)
    except RecursionError:
        result, seen = "obj:" + type(obj).__qualname__, [f" (a {type(obj).__qualname__})"]
    if blind is not None:
        blind.extend(seen)
    memo[id(obj)] = result
    return result


def _describe_object(
    obj: Any, memo: dict[int, str], codecs: Sequence[Codec], blind: list[str]
) -> str:
    """``_describe`` for what is neither code nor data: its parts, each described."""

    def part(value: Any, where: str) -> str:
        inner: list[str] = []
        described = _describe(value, memo, codecs, inner)
        blind.extend(where + w for w in inner)
        return described

    t = type(obj)
    if isinstance(obj, enum.Enum):
        return f"enum:{_describe(t, memo, codecs, blind)}.{obj.name}"
    if isinstance(obj, logging.Logger):  # `log.info(...)` in a node: no part of its output
        return f"logger:{obj.name}"
    if isinstance(obj, re.Pattern):
        return "re:" + digest([obj.pattern, obj.flags])
    if isinstance(obj, functools.partial):
        parts = [part(obj.func, ".func")]
        parts += [part(a, f".args[{i}]") for i, a in enumerate(obj.args)]
        parts += [f"{k}={part(v, f'.keywords[{k!r}]')}" for k, v in sorted(obj.keywords.items())]
    elif isinstance(obj, types.MethodType):  # a bound method: `go = TOK.go`
        parts = [part(obj.__func__, ".__func__"), part(obj.__self__, ".__self__")]
    elif t in (list, tuple):  # plain containers holding something that is not data
        parts = [part(v, f"[{i}]") for i, v in enumerate(obj)]
    elif t is dict and all(type(k) in (str, int) for k in obj):
        parts = [f"{k!r}={part(v, f'[{k!r}]')}" for k, v in obj.items()]
        parts.sort()
    elif t in (set, frozenset):
        parts = sorted(part(v, "{...}") for v in obj)
    elif _is_user_module(sys.modules.get(t.__module__)) and _has_attributes(obj):
        # a module-level instance of the user's own class (a tokenizer, a config)
        parts = [_describe(t, memo, codecs, blind)]
        parts += [f"{k}={part(v, f'.{k}')}" for k, v in sorted(_attributes(obj).items())]
    else:
        blind.append(f" (a {t.__qualname__})")
        return "obj:" + t.__qualname__
    return f"{t.__qualname__}:" + blake3("\0".join(parts).encode()).hexdigest()


_DESCRIPTORS = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)


def _library_function(obj: Any) -> str | None:
    """``module.name`` of a library function that is not a Python one — a numpy ufunc or
    array-function dispatcher (``np.add``, ``np.dot``), a Cython function
    (``np.random.default_rng``), a builtin type's method (``str.lower``) — found under
    that name in its library module, as a library's Python function is known by its name;
    None for anything else (a library object's instance, even a callable one, has state).
    """
    if isinstance(obj, _DESCRIPTORS):
        owner = obj.__objclass__
        if _is_user_module(sys.modules.get(owner.__module__)):
            return None
        return f"{owner.__module__}.{obj.__qualname__}"
    if not callable(obj):
        return None
    module_name = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module_name, str) or not isinstance(name, str):
        return None
    module = sys.modules.get(module_name)
    if module is None or _is_user_module(module):
        return None
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    return f"{module_name}.{name}" if found is obj else None


def _has_attributes(obj: Any) -> bool:
    return hasattr(obj, "__dict__") or any("__slots__" in vars(c) for c in type(obj).__mro__)


def _attributes(obj: Any) -> dict[str, Any]:
    """An instance's data attributes: its ``__dict__`` and its slots that are set."""
    found = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found.setdefault(name, getattr(obj, name))
    return found


def _own(obj: Any) -> tuple[bytes, list[list[str]], frozenset[str]]:
    """The digest of ``obj``'s own code, the dotted names it reads, and the names it
    changes in place (read once per object)."""
    cached = _sources.get(obj)
    if cached is not None:
        return cached
    h = blake3()
    h.update(f"{obj.__module__}.{obj.__qualname__}\0".encode())
    # The source of a lambda is the whole statement around it, shared by every lambda in
    # it (`Apply(lambda x: x + 1) | Apply(lambda x: x * 2)`): a lambda is known by its code.
    is_lambda = getattr(obj, "__name__", None) == "<lambda>"
    tree = None if is_lambda else source_tree(obj)
    wrote: frozenset[str] = frozenset()
    if tree is None:
        names: list[list[str]] = []
        for f in functions(obj):
            code_digest(f.__code__, h)
            names += code_names(f.__code__)
    else:
        strip_docstrings(tree)
        h.update(ast.dump(tree, annotate_fields=False, include_attributes=False).encode())
        names, wrote = referenced(tree), frozenset(written(tree))
    result = (h.digest(), names, wrote)
    with contextlib.suppress(TypeError):  # objects that take no weak reference
        _sources[obj] = result
    return result


def _fingerprint(
    obj: Any, memo: dict[int, str], codecs: Sequence[Codec] = (), blind: list[str] | None = None
) -> str:
    """``obj``'s code and, transitively, the user code it references.

    ``memo`` holds what one top-level call has computed, so the result depends only on
    the object fingerprinted, never on what was fingerprinted before it. What the key
    cannot see of the globals read (see ``_describe``) is added to ``blind``:
    ``"TOK.lock (a Lock)"``.
    """
    done_or_running = memo.get(id(obj))
    if done_or_running is not None:
        return done_or_running
    memo[id(obj)] = "cycle:" + str(obj.__qualname__)  # recursion between helpers
    h = blake3(_own(obj)[0])
    for dotted, target in _references(obj):
        inner: list[str] = []
        described = (
            record(target)
            if is_record(obj, dotted, target)
            else _describe(target, memo, codecs, inner)
        )
        h.update(f"{dotted}={described}\0".encode())
        if blind is not None:
            blind.extend(dotted + where for where in inner)
    for f in functions(obj):  # default values, made when the code ran: ``k=k`` in a factory
        defaults = [*(f.__defaults__ or ()), *sorted((f.__kwdefaults__ or {}).items())]
        if defaults:
            inner = []
            described = _describe(defaults, memo, codecs, inner)
            h.update(f"{f.__qualname__} defaults={described}\0".encode())
            if blind is not None:
                blind.extend(f"{f.__name__} defaults" + where for where in inner)
    result = h.hexdigest()
    memo[id(obj)] = result
    return result


_RECORDS = (list, dict, set)


def is_record(obj: Any, dotted: str, target: Any) -> bool:
    """Whether the global ``dotted`` is a list, dict or set ``obj``'s own code changes in
    place (``CALLS["n"] += 1``, ``SEEN.append(x)``), or an object of the user's whose
    attributes it sets or changes (``STATS.calls += 1``): a record the code keeps, not data
    its output depends on. It enters by its type, so counting calls does not change the
    key (nor make the cache miss at every call)."""
    written = _own(obj)[2]
    if type(target) in _RECORDS:
        return dotted in written
    # an object of the user's whose attributes the code sets or changes (STATS.calls += 1,
    # STATS.seen.append(x)): its record too
    return (
        not isinstance(target, (type, types.ModuleType, types.FunctionType))
        and _has_attributes(target)
        and _is_user_module(sys.modules.get(type(target).__module__))
        and any(w == dotted or w.startswith(dotted + ".") for w in written)
    )


def record(target: Any) -> str:
    """How a record (``is_record``) enters a fingerprint."""
    return f"record:{type(target).__qualname__}"


def _references(obj: Any) -> list[tuple[str, Any]]:
    """(dotted name, object) of every global or closure name ``obj``'s code reads."""
    names = _own(obj)[1]
    module = sys.modules.get(obj.__module__)
    scope = dict(vars(module)) if module else {}
    if isinstance(obj, types.FunctionType):
        scope.update(obj.__globals__)
    # Closures: `def make(k): class Mul(Node): ... x * k` makes classes that differ by `k`
    # alone; a closure variable shadows a global of the same name.
    for f in functions(obj):
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or (), strict=True):
            with contextlib.suppress(ValueError):  # an empty cell: not assigned yet
                scope[name] = cell.cell_contents
    done = set()
    found = []
    for chain in names:
        if chain[0] not in scope or chain[0] in ("self", "cls"):
            continue
        target = scope[chain[0]]
        used = [chain[0]]
        for attr in chain[1:]:  # follow module attributes: mod.helper, pkg.mod.helper
            if not isinstance(target, types.ModuleType) or not hasattr(target, attr):
                break
            target = getattr(target, attr)
            used.append(attr)
        dotted = ".".join(used)
        if dotted in done or target is obj:
            continue
        done.add(dotted)
        found.append((dotted, target))
    return found


def fingerprint(obj: type | types.FunctionType, codecs: Sequence[Codec] = ()) -> str:
    """A digest of a class's or function's code and of the user helpers it references
    (and of the data they read as globals: with ``codecs``, tensors and arrays too)."""
    return _fingerprint(obj, {}, codecs)


def identity(impl: Any, codecs: Sequence[Codec] = ()) -> str:
    """The identity part of a node's key: qualified class name, code fingerprint, versions.

    Example:
        >>> from somatize import Node
        >>> class A(Node): pass
        >>> identity(A()) == identity(A())
        True
    """
    cls = type(impl)
    blind: list[str] = []
    fp = _fingerprint(cls, {}, codecs, blind)
    for where in blind:
        _warn_blind(cls, where)
    return f"{cls.__module__}.{cls.__qualname__}:{fp}:{_versions()}"


_warned: set[tuple[str, str]] = set()


def _warn_blind(cls: type, where: str, reads: str = "reads the global") -> None:
    """Say once per process that a node's key cannot see an object its code reads."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if (name, where) in _warned:
        return
    _warned.add((name, where))
    warnings.warn(
        f"node class {name!r} {reads} {where}, which enters its key by type "
        "alone: a change to that object will not be seen, and a cached output computed "
        "before the change will be served after it. Make it plain data, a function, a "
        "functools.partial or an instance of your own class holding data, or pass it as "
        "a constructor argument",
        UserWarning,
        stacklevel=outside(),
    )
