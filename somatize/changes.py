"""What a fingerprint is made of, to say *which* part of a key changed.

``Graph.explain`` and ``st.remember``'s ``explain`` compare these between the entry they
missed and what they have now: ``code_parts`` names each function or class whose own
code changed (transitively through the user's helpers); ``key_parts`` lists how each
name a function reads entered its key. Both read the same source analysis as
``somatize/identity.py``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .identity import _describe, _references, is_record, record
from .own_code import _own
from .user_modules import _is_user_module, _versions

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["code_parts", "global_parts", "key_parts"]

_CODE = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)


def code_parts(obj: type | types.FunctionType) -> dict[str, str]:
    """The digest of ``obj``'s own code and of each user helper it reaches, by qualified
    name: what ``Graph.explain`` compares to say *which* code changed.

    Example:
        >>> def f(x): return x + 1
        >>> list(code_parts(f))  # doctest: +ELLIPSIS
        ['...f']
    """
    return {name: _own(o)[0].hex() for name, o, _ in _reached(obj)}


def global_parts(obj: type | types.FunctionType) -> dict[str, str]:
    """How each global (or closure value) that is not the user's code enters the key, for
    ``obj`` and each user helper it reaches: ``"FACTOR (read by app.Count)"`` → its
    description (data by content). What ``Graph.explain`` compares to name a global whose
    value changed.

    Example:
        >>> LIMIT = 3
        >>> def f(x): return min(x, LIMIT)
        >>> list(global_parts(f))  # doctest: +ELLIPSIS
        ['LIMIT (read by ...f)']
    """
    return {
        f"{dotted} (read by {name})": (
            record(target) if is_record(o, dotted, target) else _describe(target, {})
        )
        for name, o, references in _reached(obj)
        for dotted, target in references
        if not _user_code(target) and not isinstance(target, _CODE)
    }


def _user_code(target: Any) -> bool:
    return isinstance(target, (types.FunctionType, type)) and _is_user_module(
        sys.modules.get(target.__module__)
    )


def _reached(obj: Any) -> Iterator[tuple[str, Any, list[tuple[str, Any]]]]:
    """(qualified name, object, its references) of ``obj`` and of each user helper it
    reaches, transitively, each once."""
    seen: set[str] = set()
    todo: list[Any] = [obj]
    while todo:
        o = todo.pop()
        name = f"{o.__module__}.{o.__qualname__}"
        if name in seen:
            continue
        seen.add(name)
        references = _references(o)
        todo.extend(target for _, target in references if _user_code(target))
        yield name, o, references


def key_parts(
    obj: type | types.FunctionType, codecs: Sequence[Codec] = ()
) -> tuple[str, dict[str, str], str]:
    """What ``fingerprint(obj)`` is made of, to say which part changed: the digest of
    ``obj``'s own code; each global or closure value it reads with how it enters
    (``"code:<digest>"`` for the user's helpers, ``"lib:<name>"`` for libraries,
    ``"data:<digest>"`` for data — with ``codecs``, tensors too — and ``"obj:<type>"``);
    and the somatize and torch versions. ``st.remember`` keys a run with these.
    """
    memo: dict[int, str] = {id(obj): "self"}
    refs = {}
    for dotted, target in _references(obj):
        refs[dotted] = (
            record(target) if is_record(obj, dotted, target) else _describe(target, memo, codecs)
        )
    return _own(obj)[0].hex(), refs, _versions()
