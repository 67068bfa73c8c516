"""Reading back the canonical encoding of ``somatize.values`` (its docstring has the format)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["decode", "in_decoded_order"]

_LEN = struct.Struct(">Q")
_FLOAT = struct.Struct(">d")


def decode(data: bytes | memoryview, codecs: Sequence[Codec] = ()) -> Any:
    """Read back a value written by ``encode`` (codec leaves need the same codecs).

    Raises:
        ValueError: ``data`` is not an encoded value (torn, cut or altered), whatever
            the damage: a caller treating damage as absence catches this one error.
    """
    view = memoryview(data)
    try:
        value, end = _decode(view, 0, {c.tag: c for c in codecs})
    except (struct.error, IndexError, TypeError, RecursionError) as e:
        # a cut length field, a list as a dict key, nesting past the stack
        raise ValueError(
            f"not an encoded value (damaged?): {type(e).__name__}: {e}; decode reads the bytes "
            "somatize.encode returned"
        ) from e
    if end != len(view):
        raise ValueError(
            f"{len(view) - end} trailing bytes after an encoded value; decode takes exactly the "
            "bytes encode returned (not a longer buffer)"
        )
    return value


def _decode(view: memoryview, i: int, codecs: dict[str, Codec]) -> tuple[Any, int]:
    tag = view[i : i + 1].tobytes()
    i += 1
    if tag == b"N":
        return None, i
    if tag == b"T" or tag == b"F":
        return tag == b"T", i
    if tag == b"f":
        return _FLOAT.unpack_from(view, i)[0], i + 8
    if tag in (b"l", b"t", b"d"):
        (n,) = _LEN.unpack_from(view, i)
        i += 8
        if tag == b"d":
            d = {}
            for _ in range(n):
                k, i = _decode(view, i, codecs)
                d[k], i = _decode(view, i, codecs)
            return d, i
        items = []
        for _ in range(n):
            item, i = _decode(view, i, codecs)
            items.append(item)
        return (items if tag == b"l" else tuple(items)), i
    (n,) = _LEN.unpack_from(view, i)
    i += 8
    if tag == b"c":
        name = view[i : i + n].tobytes().decode()
        i += n
        (size,) = _LEN.unpack_from(view, i)
        i += 8
        if name not in codecs:
            raise ValueError(
                f"the value was written by codec {name!r}, which was not passed; pass the codecs "
                "it was encoded with: decode(data, codecs=[...]) (e.g. st.TensorCodec())"
            )
        return codecs[name].decode(view[i : i + size].tobytes()), i + size
    raw = view[i : i + n]
    if len(raw) != n:
        raise ValueError(
            f"truncated encoded value: {n} bytes announced, {len(raw)} left; decode takes all "
            "the bytes encode returned"
        )
    if tag == b"i":
        return int.from_bytes(raw, "big", signed=True), i + n
    if tag == b"s":
        return raw.tobytes().decode("utf-8", "surrogatepass"), i + n
    if tag == b"b":
        return raw.tobytes(), i + n
    raise ValueError(
        f"unknown tag {tag!r} in an encoded value: these bytes are not (or no longer) what "
        "somatize.encode wrote"
    )


def in_decoded_order(value: Any) -> Any:
    """``value`` with every dict (nested in lists, tuples and dicts) in the key order
    ``decode`` gives it: the order of the keys' encodings. What a cached node returns on a
    miss then has the order it has on a hit, for code that reads ``d.values()`` in order."""
    t = type(value)
    if t is dict:
        from .values import encode  # (values imports this module)

        try:
            items = sorted(value.items(), key=lambda kv: encode(kv[0]))
        except Exception:  # a key that is not data: left as it is (encode words the error)
            return value
        return {k: in_decoded_order(v) for k, v in items}
    if (t is list or t is tuple) and any(type(v) in _NESTED for v in value):
        return t(in_decoded_order(v) for v in value)
    return value


_NESTED = (dict, list, tuple)
