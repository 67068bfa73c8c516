"""What a node class's code reads, watched between keys: so that a global rebound later in
the process (a helper redefined in a notebook, ``SHIFT = torch.full(...)``), or a global
tensor or module changed in place (a checkpoint loaded into a module-level backbone), is
seen at the next key, not only by a new graph.

``NodeKeys`` reads a node class's code once per graph (``identity``); ``watch`` lists,
for the class and each user helper its code reaches, the names it reads that could change
its output — the user's own code, data, tensors and modules, not library code — with the
object each is bound to and, for what a codec fingerprints, that fingerprint. ``still``
checks them at every key: a dict lookup per name (a walk, not a hash, for a module, as
for a node's own weights). A list, dict or set of plain values (numbers, strings, bytes,
None, and lists, tuples, dicts and sets of them: ``CFG = {"scale": 2.0}``), up to
``CONTENT_LIMIT`` values in all, is also compared with a copy of its content, so that
``CFG["scale"] = 3.0`` is seen as ``CFG = {...}`` is; up to ``EXACT_LIMIT`` values, type
for type too (``CFG["k"] = 2`` then ``2.0``: ``==`` holds ``2 == 2.0``), by comparing its
pickle (written only, never read back). One holding other objects, or
more values, is read once, when the class is first keyed: rebind it to change it. One
the code itself changes in place (a call counter: ``identity.is_record``) is its record,
not compared.

The code is watched too: the functions the class and each user helper and base class
hold, and their code objects, by identity (``own_code.stamp``) — a method patched on the
class (``Enc.forward = f2``), or code replaced in place by IPython's ``%autoreload 2``, is
read again at the next key (a few calls in C per class: ``own_code.unchanged``).
"""

from __future__ import annotations

import pickle
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .changes import _reached, _user_code
from .identity import is_record
from .own_code import MEMBER, stamp, unchanged
from .source_code import functions
from .user_modules import _attributes, _has_attributes, _is_user_module

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["CONTENT_LIMIT", "EXACT_LIMIT", "Watched", "still", "watch"]

_MISSING = object()
_CODE = object()  # where a watched code stamp is (own_code.stamp), in place of a scope
CONTENT_LIMIT = 10_000  # plain values a watched container may hold to be compared by content
EXACT_LIMIT = 1_000  # and to be compared type for type too (1 -> 1.0 seen): by its pickle
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MUTABLE = (list, dict, set, bytearray)
_LIBRARY = (types.ModuleType, types.BuiltinFunctionType, types.FunctionType, type)

# (where the name lives — a module's globals or a closure cell —, its first name, the
# attributes after it, the object it was bound to, the codec and fingerprint then or None,
# a copy of its content then — a container of plain values — and its pickle (or None), or
# _MISSING); or, for a class's or function's code, (_CODE, "", (), its Stamp, None, None,
# _MISSING)
Watched = list[tuple[Any, str, tuple[str, ...], Any, Any, str | None, Any]]


def _content(obj: Any) -> Any:
    """A copy of a container of plain values, as ``==`` compares it, or ``_MISSING`` where
    ``obj`` is not one (or holds more than ``CONTENT_LIMIT`` values). Immutable values are
    kept as they are: only the containers are new. An instance of the user's own class (a
    config object) is copied as its class and its attributes, each as above."""
    mine = _is_mine(obj)
    if not mine and not isinstance(obj, _MUTABLE):
        return _MISSING
    budget = [CONTENT_LIMIT]

    def copy(o: Any) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise OverflowError
        t = type(o)
        if t in _SCALARS:
            return o
        if t is list or t is tuple:
            return t(copy(v) for v in o)
        if t is dict:
            return {copy(k): copy(v) for k, v in o.items()}
        if t is set or t is frozenset:
            return t(copy(v) for v in o)
        if t is bytearray:
            return bytes(o)
        if _is_mine(o):
            return (t, {k: copy(v) for k, v in sorted(_attributes(o).items())})
        raise TypeError

    try:
        copied = copy(obj)
    except (OverflowError, TypeError, RecursionError):
        return _MISSING
    exact = _pickled(copied if mine else obj) if CONTENT_LIMIT - budget[0] <= EXACT_LIMIT else None
    return copied, exact


def _is_mine(obj: Any) -> bool:
    """Whether ``obj`` is an instance of a class from the user's own modules, with
    attributes (not a class, a function or a module)."""
    t = type(obj)
    return (
        not isinstance(obj, _LIBRARY)
        and _has_attributes(obj)
        and _is_user_module(sys.modules.get(t.__module__))
    )


def _pickled(obj: Any) -> bytes | None:
    """``obj`` pickled (written, never read back): bytes that tell ``1``, ``1.0``, ``True``
    and ``-0.0`` apart, where ``==`` does not; None if it cannot be."""
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:  # (an object of the user's that refuses: compared by == alone)
        return None


def _holds(now: Any, content: tuple[Any, bytes | None]) -> bool:
    """Whether ``now`` holds what ``content`` (``_content``) copied: equal, and where it was
    small enough, of the same types (its pickle). A value ``==`` cannot compare (a tensor
    put in the container) is a change."""
    copied, exact = content
    if type(copied) is tuple and len(copied) == 2 and type(copied[0]) is type:
        return bool(_content(now) == content)  # (an instance of the user's: copied again, compared)
    try:
        return bool(now == copied) and (exact is None or _pickled(now) == exact)
    except Exception:  # (bool of a tensor of several values, an __eq__ that raises)
        return False


def _scope(obj: Any, name: str) -> Any:
    """Where ``obj``'s code finds ``name``: a closure cell, else its module's globals."""
    for f in functions(obj):
        if name in f.__code__.co_freevars and f.__closure__:
            return f.__closure__[f.__code__.co_freevars.index(name)]
    if isinstance(obj, types.FunctionType):
        return obj.__globals__
    module = sys.modules.get(obj.__module__)
    return vars(module) if module is not None else {}


def watch(obj: Any, codecs: Sequence[Codec]) -> Watched:
    """The names ``obj``'s code (a class or a function, and the user helpers it reaches)
    reads that could change its output; and the code itself, of ``obj``, of each helper and
    of the user's own classes ``obj`` inherits from (``own_code.stamp``)."""
    out: Watched = []
    reached = list(_reached(obj))
    records = {d for _, user, refs in reached for d, t in refs if is_record(user, d, t)}
    stamped: set[int] = set()
    for _, user, references in reached:
        _stamp(out, user, stamped)
        for dotted, target in references:
            if isinstance(target, _LIBRARY) and not _user_code(target):
                continue  # (library code enters by name and version; torch stays torch)
            if dotted.startswith(MEMBER):
                continue  # (a function the class holds: its class's stamp has it)
            first, *rest = dotted.split(".")
            fp = next(((c, f) for c in codecs if (f := c.fingerprint(target)) is not None), None)
            codec, seen = fp if fp is not None else (None, None)
            keeps = codec is None and dotted not in records  # (a record: the code's own)
            content = _content(target) if keeps else _MISSING
            out.append((_scope(user, first), first, tuple(rest), target, codec, seen, content))
    for base in obj.__mro__[1:] if isinstance(obj, type) else ():
        if _user_code(base):
            _stamp(out, base, stamped)
    return out


def _stamp(out: Watched, obj: Any, stamped: set[int]) -> None:
    if id(obj) not in stamped and isinstance(obj, (type, types.FunctionType)):
        stamped.add(id(obj))
        out.append((_CODE, "", (), stamp(obj), None, None, _MISSING))


def still(watched: Watched) -> bool:
    """Whether every watched name is bound as it was, to what fingerprints as it did, and
    holds what it held (a container of plain values); and every watched class or function
    holds the same code (``own_code.unchanged``)."""
    for where, first, rest, target, codec, seen, content in watched:
        if type(where) is dict:
            now = where.get(first, _MISSING)
        elif where is _CODE:
            if not unchanged(target):
                return False
            continue
        else:
            try:
                now = where.cell_contents
            except ValueError:  # (an emptied cell)
                return False
        for attr in rest:
            now = getattr(now, attr, _MISSING)
        if now is not target or (codec is not None and codec.fingerprint(target) != seen):
            return False
        if content is not _MISSING and not _holds(now, content):  # (bytearray == bytes)
            return False
    return True
