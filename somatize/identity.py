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

Each object's own code is read in ``own_code.py`` (and read again when it changes in
place); which modules are the user's own, in ``user_modules.py``. Here: how the names that
code reads enter a fingerprint (``_describe``), and the fingerprint itself.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import random
import re
import sys
import threading
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .held_values import value_kind
from .own_code import MEMBER, members
from .own_code import _own as _own
from .source_code import functions
from .stack import outside
from .user_modules import _attributes as _attributes
from .user_modules import _has_attributes as _has_attributes
from .user_modules import _is_user_module as _is_user_module
from .user_modules import _library_function as _library_function
from .user_modules import _versions as _versions
from .values import digest, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["fingerprint", "identity"]


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
    elif (how := value_kind(t)) is not None:  # an immutable value (a Fraction): by value
        return f"value:{t.__qualname__}:" + digest(how(obj))
    else:
        blind.append(f" (a {t.__qualname__})")
        return "obj:" + t.__qualname__
    return f"{t.__qualname__}:" + blake3("\0".join(parts).encode()).hexdigest()


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
    for dotted, target in _references(obj):  # (a class's members among them: own_code.py)
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
    # a function the class holds that its body did not define (patched in): its own code
    found += [(f"{MEMBER}{name}", f) for name, f in members(obj)]
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
_quiet = threading.local()  # .on: key parts read for another purpose than a key (quietly)


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Read key parts without saying what enters them by type alone, in this thread: they
    are not a key here (a placed node's code compared with what its host last got), and
    the warning is still said, once, where a key reads them."""
    before = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = before


def _warn_blind(
    cls: type, where: str, reads: str = "reads the global", what: str = "node class"
) -> None:
    """Say once per process that a node's key cannot see an object its code reads (or
    that it, or a module it holds, holds)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if (name, where) in _warned or getattr(_quiet, "on", False):
        return
    _warned.add((name, where))
    warnings.warn(
        f"{what} {name!r} {reads} {where}, which enters its key by type "
        "alone: a change to that object will not be seen, and a cached output computed "
        "before the change will be served after it. Make it plain data, a function, a "
        "functools.partial or an instance of your own class holding data, or pass it as "
        "a constructor argument",
        UserWarning,
        stacklevel=outside(),
    )
