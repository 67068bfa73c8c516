"""What a node class's code reads, watched between keys: so that a global rebound later in
the process (a helper redefined in a notebook, ``SHIFT = torch.full(...)``), or a global
tensor or module changed in place (a checkpoint loaded into a module-level backbone), is
seen at the next key, not only by a new graph.

``NodeKeys`` reads a node class's code once per graph (``identity``); ``watch`` lists,
for the class and each user helper its code reaches, the names it reads that could change
its output — the user's own code, data, tensors and modules, not library code — with the
object each is bound to and, for what a codec fingerprints, that fingerprint. ``still``
checks them at every key: a dict lookup per name (a walk, not a hash, for a module, as
for a node's own weights). A list or dict mutated in place is not seen: its content was
read when the class was first keyed.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .changes import _reached, _user_code
from .source_code import functions

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["Watched", "still", "watch"]

_MISSING = object()
_LIBRARY = (types.ModuleType, types.BuiltinFunctionType, types.FunctionType, type)

# (where the name lives — a module's globals or a closure cell —, its first name, the
# attributes after it, the object it was bound to, the codec and fingerprint then or None)
Watched = list[tuple[Any, str, tuple[str, ...], Any, Any, str | None]]


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
    reads that could change its output."""
    out: Watched = []
    for _, user, references in _reached(obj):
        for dotted, target in references:
            if isinstance(target, _LIBRARY) and not _user_code(target):
                continue  # (library code enters by name and version; torch stays torch)
            first, *rest = dotted.split(".")
            fp = next(((c, f) for c in codecs if (f := c.fingerprint(target)) is not None), None)
            codec, seen = fp if fp is not None else (None, None)
            out.append((_scope(user, first), first, tuple(rest), target, codec, seen))
    return out


def still(watched: Watched) -> bool:
    """Whether every watched name is bound as it was, to what fingerprints as it did."""
    for where, first, rest, target, codec, seen in watched:
        if type(where) is dict:
            now = where.get(first, _MISSING)
        else:
            try:
                now = where.cell_contents
            except ValueError:  # (an emptied cell)
                return False
        for attr in rest:
            now = getattr(now, attr, _MISSING)
        if now is not target or (codec is not None and codec.fingerprint(target) != seen):
            return False
    return True
