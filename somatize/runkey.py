"""A call's key: the function's identity and its arguments' content, with its parts.

The key of ``fn(*args, **kwargs)`` is built like a node's: the function's own code and
the user helpers it calls (``somatize.changes.key_parts``), the somatize and torch
versions, and a digest of each argument's content (``somatize.values.digest``, with
the codecs the caller passes for tensors). An argument that cannot be keyed by its
content is an error naming it and the fix. ``somatize.runs`` keeps the parts in each
run's record, so ``explain`` can say which one changed.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .changes import key_parts
from .errors import ValueConversionError
from .identity import _describe
from .values import digest

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["CallKey", "call_key", "keyable", "summarize_value"]

Adapt = Callable[[Any, str], Any]  # (value, where) -> keyable data, or NotImplemented


@dataclass(frozen=True)
class CallKey:
    """The key of one call, with the parts it is made of (``explain`` compares them)."""

    key: str
    function: str
    code: str
    helpers: dict[str, str]
    versions: str
    args: dict[str, str]  # argument -> digest of its content
    summary: dict[str, str]  # argument -> a short description, for people
    excluded: tuple[str, ...]


def _unkeyable(where: str, what: str, fix: str, name: str) -> ValueConversionError:
    return ValueConversionError(
        f"{where} is {what}, which cannot enter the run's key; {fix} — or, if it does not "
        f"change the result (a logger, a callback), leave it out of the key explicitly: "
        f"st.remember(fn, keeper=..., exclude=({name!r},)); runs that differ only in it then "
        "share one key (a client's data left out: every client recalls the first's run)"
    )


def keyable(value: Any, where: str, name: str, codecs: Sequence[Codec], adapt: Adapt | None) -> Any:
    """``value`` as data a digest can be taken of; an error naming ``where`` and the fix."""
    t = type(value)
    if value is None or t in (bool, int, float, str, bytes):
        return value
    if t is list or t is tuple:
        return t(keyable(v, f"{where}[{i}]", name, codecs, adapt) for i, v in enumerate(value))
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        fields = {
            f: keyable(getattr(value, f), f"{where}.{f}", name, codecs, adapt)
            for f in value._fields
        }
        return {"namedtuple": _describe(t, {}), "fields": fields}
    if isinstance(value, Mapping):  # dict, OrderedDict (a state_dict), fedavg's Aggregate
        out = {}
        for k, v in value.items():
            if type(k) is not str and type(k) is not int:
                raise _unkeyable(
                    f"{where}",
                    f"a mapping with a {type(k).__name__} key {k!r}",
                    "use str or int keys",
                    name,
                )
            out[k] = keyable(v, f"{where}[{k!r}]", name, codecs, adapt)
        return out
    for codec in codecs:
        if codec.accepts(value):
            try:
                codec.check(value)
            except ValueConversionError as e:
                raise _unkeyable(
                    where, str(e).split(";")[0], "detach it or pass plain data", name
                ) from None
            # the codec's digest: a tensor's is remembered by its version counter, so the
            # global state that every client of a round receives is hashed once a round
            fp = codec.fingerprint(value)
            return value if fp is None else {"codec": codec.tag, "digest": fp}
    if adapt is not None:
        adapted = adapt(value, where)
        if adapted is not NotImplemented:
            return keyable(adapted, where, name, codecs, adapt)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: keyable(getattr(value, f.name), f"{where}.{f.name}", name, codecs, adapt)
            for f in dataclasses.fields(value)
        }
        return {"dataclass": _describe(t, {}), "fields": fields}
    if isinstance(value, types.FunctionType) and value.__name__ == "<lambda>":
        raise _unkeyable(
            where, "a lambda", "define it with def (its code then enters the key)", name
        )
    if isinstance(value, (types.FunctionType, type, types.BuiltinFunctionType, types.ModuleType)):
        return {"code": _describe(value, {})}
    if isinstance(value, io.IOBase):
        raise _unkeyable(where, "an open file", "pass its contents (f.read()) instead", name)
    if isinstance(value, types.GeneratorType) or hasattr(value, "__next__"):
        raise _unkeyable(
            where,
            f"a {t.__qualname__} (an iterator)",
            "pass the data itself: materialise it with list(...)",
            name,
        )
    if isinstance(value, (set, frozenset)):
        raise _unkeyable(where, "a set", "pass sorted(...) as a list", name)
    raise _unkeyable(
        where,
        f"an object of type {t.__module__}.{t.__qualname__}",
        "pass plain data (numbers, str, lists, dicts, tensors, dataclasses of those) and "
        "build the object inside the function",
        name,
    )


def summarize_value(value: Any, depth: int = 0) -> str:
    """A short description of an argument for listings: ``3``, ``tensor float32 [64, 4]``,
    ``list of 12``, a short tuple or dict item by item (``(Tensor float32 [64, 4], 3, 0.1)``,
    a federated client's task) (cheap: never the repr of a tensor or of a large container)."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__} {str(dtype).removeprefix('torch.')} {list(shape)}"
    t = type(value)
    if value is None or t in (bool, int, float):
        return repr(value)
    if t in (str, bytes):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, (list, tuple, Mapping)):
        items = list(value.values() if isinstance(value, Mapping) else value)
        if len(items) <= 4 and all(x is None or type(x) in (bool, int, float) for x in items):
            text = repr(dict(value) if isinstance(value, Mapping) else value)
            if len(text) <= 40:
                return text
        if depth == 0 and len(items) <= 6 and t in (tuple, list, dict):
            parts = [summarize_value(x, 1) for x in items]
            if any(isinstance(x, (list, tuple, Mapping)) for x in items):
                parts = []  # (containers of containers: a batch list stays "list of 4")
            if t is dict:
                parts = [f"{summarize_value(k, 1)}: {p}" for k, p in zip(value, parts)]
            ends = "()" if t is tuple else "[]" if t is list else "{}"
            text = ends[0] + ", ".join(parts) + ("," if t is tuple and len(parts) == 1 else "")
            if parts and len(text) < 80:
                return text + ends[1]
        return f"{t.__name__} of {len(value)}"
    return t.__qualname__


def call_key(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    exclude: Sequence[str] = (),
    codecs: Sequence[Codec] = (),
    adapt: Adapt | None = None,
    identity: tuple[str, dict[str, str], str] | None = None,
) -> CallKey:
    """The key of ``fn(*args, **kwargs)``: its identity and its arguments' content.

    Args:
        exclude: argument names left out of the key (a pool, a logger).
        codecs: for tensor and array arguments (``somatize.torch`` passes its own).
        adapt: turns other objects into keyable data (or returns NotImplemented).
        identity: ``somatize.identity.key_parts(fn)`` computed elsewhere (in the process that
            shipped ``fn``); by default computed now.

    Raises:
        ValueConversionError: an argument cannot be keyed (the message names it and the fix).
    """
    name = f"{fn.__module__}.{fn.__qualname__}"
    sig = inspect.signature(fn)
    unknown = sorted(set(exclude) - set(sig.parameters))
    if unknown:
        raise ValueError(
            f"exclude names {', '.join(map(repr, unknown))}, which {fn.__qualname__} does not "
            f"take; its arguments: {', '.join(sig.parameters) or 'none'}"
        )
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    digests, summary = {}, {}
    for arg, value in bound.arguments.items():
        if arg in exclude:
            continue
        where = f"argument {arg!r} of {fn.__qualname__}"
        data = keyable(value, where, arg, codecs, adapt)
        digests[arg] = digest(data, codecs, where)
        summary[arg] = summarize_value(value)
    if identity is None:
        identity = key_parts(fn, codecs)  # type: ignore[arg-type]  # checked by the caller
    code, helpers, versions = identity
    key = digest(
        {"function": name, "code": code, "helpers": helpers, "versions": versions, "args": digests}
    )
    return CallKey(key, name, code, helpers, versions, digests, summary, tuple(sorted(exclude)))
