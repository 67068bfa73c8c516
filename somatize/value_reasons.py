"""Why a value is not data, in words: the reason ``values`` gives when it refuses one
(a set, an iterator, a subclass of a plain type, a tensor without the torch codecs...),
each with its fix."""

from __future__ import annotations

import types
from collections.abc import Iterable

from .opaque import Opaque

__all__: list[str] = []


def _reason(value: object) -> str:
    t = type(value)
    name = f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
    if isinstance(value, Opaque):
        return (
            "an Opaque inside a data value; Opaque must wrap the whole value — "
            "return Opaque((a, b)) rather than (Opaque(a), Opaque(b))"
        )
    if isinstance(value, (set, frozenset)):
        return (
            f"a {name}; sets have no order and do not cross edges — "
            "convert it with sorted(...) into a list, or wrap it in Opaque(...)"
        )
    if isinstance(value, (types.GeneratorType, Iterable)) and hasattr(value, "__next__"):
        return f"a {name} (an iterator); materialise it with list(...) before returning it"
    for base in (bool, int, float, str, bytes, list, tuple, dict):
        if isinstance(value, base):
            return (
                f"a {name}, a subclass of {base.__name__}; subclasses do not cross edges "
                f"as data — convert it with {base.__name__}(...) or wrap it in Opaque(...)"
            )
    if isinstance(value, (bytearray, memoryview)):
        return f"a {name}; convert it with bytes(...) or wrap it in Opaque(...)"
    if t.__module__.split(".")[0] == "torch" and getattr(value, "requires_grad", False) is True:
        return (
            f"a {name} that requires grad: it crosses an edge only by identity — wrap it in "
            "Opaque(...), or call the graph as a module, model = st.module(g); model(x), "
            "which wraps it for you; detach it (.detach()) to pass it as data"
        )
    if t.__module__.split(".")[0] in ("torch", "numpy"):
        return (
            f"an object of type {name}: tensors and arrays are data only with the codecs of "
            "somatize.torch — call st.module(g) first, which gives the graph its codecs (the "
            "Trainer does), or wrap it in Opaque(...) to pass it by identity (never cached)"
        )
    return (
        f"an object of type {name}; convert it to plain data (dict, list, str, numbers) "
        "or wrap it in Opaque(...) to pass it by identity"
    )
