"""A class's or function's own code — a digest of it, the dotted names it reads, the names
it changes in place — read once, and read again when it changes in place.

The source is read from the file, which is the code that runs only while the file is as
it was imported and the objects are as it defined them. So:

* what the code was read from is kept with it: a method patched on the class
  (``Enc.forward = f2``), added or removed, or a function's ``__code__`` replaced (IPython's
  ``%autoreload 2`` edits the classes and functions of a reloaded module so, in place)
  makes it be read again. ``stamp`` and ``unchanged`` are the cheap form of that check,
  made at every key (``bindings.still``): the class's function attributes and the code
  objects of their functions, compared by identity;
* a function in a class's ``__dict__`` that its body did not define (patched in, or bound
  from elsewhere: ``forward = shared_forward``) is one of its ``members``, which enter its
  fingerprint by their own code, as a helper it calls does;
* the source read is compiled and compared with the code loaded
  (``source_code.same_as_loaded``): where they differ — the file was edited since the
  process imported it — the object is known by its loaded bytecode instead, as one with no
  source is, so a process running the old code never stores its outputs under the key of
  the new code (nor is served what the new code stored).
"""

from __future__ import annotations

import ast
import contextlib
import types
import weakref
from operator import attrgetter, is_
from typing import Any

from blake3 import blake3

from .source_code import (
    code_digest,
    code_names,
    functions,
    held,
    referenced,
    same_as_loaded,
    source_tree,
    strip_docstrings,
    unwrapped,
    written,
)

__all__ = ["MEMBER", "Stamp", "members", "stamp", "unchanged"]

# (digest of its own code, dotted names it reads, names it changes in place)
Own = tuple[bytes, list[list[str]], frozenset[str]]
# The code of each class or function, read once per set of code objects it was read from.
# Only an object's own code is kept here: what its names resolve to is looked up on
# every fingerprint, since a helper module may be reloaded under an unchanged class.
_sources: weakref.WeakKeyDictionary[Any, tuple[tuple[types.CodeType, ...], Own]] = (
    weakref.WeakKeyDictionary()
)
_CODE = attrgetter("__code__")

#: How a class's ``members`` are named among what its code reads (``identity._references``).
MEMBER = "<member>."


def _codes(obj: Any) -> tuple[types.CodeType, ...]:
    return tuple([g.__code__ for f in functions(obj) for g in unwrapped(f)])


def _own(obj: Any) -> Own:
    """The digest of ``obj``'s own code, the dotted names it reads, and the names it
    changes in place (read again when its code objects are not those it was read from)."""
    codes = _codes(obj)
    kept = _sources.get(obj)
    if kept is not None and len(kept[0]) == len(codes) and all(map(is_, kept[0], codes)):
        return kept[1]
    result = _read(obj)
    with contextlib.suppress(TypeError):  # objects that take no weak reference
        _sources[obj] = (codes, result)
    return result


def _read(obj: Any) -> Own:
    h = blake3()
    h.update(f"{obj.__module__}.{obj.__qualname__}\0".encode())
    # The source of a lambda is the whole statement around it, shared by every lambda in
    # it (`Apply(lambda x: x + 1) | Apply(lambda x: x * 2)`): a lambda is known by its code.
    is_lambda = getattr(obj, "__name__", None) == "<lambda>"
    source = None if is_lambda else source_tree(obj)
    tree = None
    if source is not None and same_as_loaded(obj, *source[1:]):
        tree = source[0]  # (else the file changed since it was imported, or the lines read
        # are another definition's: known by the code that runs)
    wrote: frozenset[str] = frozenset()
    if tree is None:
        names: list[list[str]] = []
        for f in functions(obj):
            code_digest(f.__code__, h)
            names += code_names(f.__code__)
        if isinstance(obj, type):  # (the source names the bases: `class Enc(Base):`)
            names += [[base.__name__] for base in obj.__bases__ if base is not object]
    else:
        strip_docstrings(tree)
        h.update(ast.dump(tree, annotate_fields=False, include_attributes=False).encode())
        names, wrote = referenced(tree), frozenset(written(tree))
    return h.digest(), names, wrote


def members(obj: Any) -> list[tuple[str, types.FunctionType]]:
    """(attribute, function) of each function in a class's own ``__dict__`` (or that one
    wraps) which its body did not define: patched in later (``Enc.forward = f2``), or bound
    from elsewhere (``forward = shared_forward``). Its source is not the class's, so it
    enters the class's fingerprint on its own. None for a function."""
    if not isinstance(obj, type):
        return []
    inside, module = obj.__qualname__ + ".", obj.__module__
    return [
        (name, g)
        for name, value in vars(obj).items()
        for f in held(value)
        for g in unwrapped(f)
        if g.__module__ != module or not g.__qualname__.startswith(inside)
    ]


# (the class or function; the size of a class's __dict__, -1 for a function; the names of
# its attributes holding functions; those attributes; the functions; their code objects)
Stamp = tuple[
    Any, int, tuple[str, ...], tuple[Any, ...], tuple[types.FunctionType, ...], tuple[Any, ...]
]


def stamp(obj: type | types.FunctionType) -> Stamp:
    """What ``obj``'s code is made of now, for ``unchanged`` to compare by identity."""
    if isinstance(obj, types.FunctionType):
        return (obj, -1, (), (), (obj,), (obj.__code__,))
    d = vars(obj)
    names, attrs, funcs = [], [], []
    for name, value in d.items():
        found = [g for f in held(value) for g in unwrapped(f)]
        if found:
            names.append(name)
            attrs.append(value)
            funcs += found
    return (obj, len(d), tuple(names), tuple(attrs), tuple(funcs), tuple(map(_CODE, funcs)))


def unchanged(s: Stamp) -> bool:
    """Whether the class or function of ``s`` (``stamp``) holds the same functions, each
    with the same code object: a few calls in C, no Python call per attribute."""
    obj, size, names, attrs, funcs, codes = s
    if size >= 0:
        d = obj.__dict__
        if len(d) != size or tuple(map(d.get, names)) != attrs:  # (== tries `is` first)
            return False
    return tuple(map(_CODE, funcs)) == codes
