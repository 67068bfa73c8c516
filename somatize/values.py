"""Values at the conversion boundary: data, codec values, and ``Opaque``.

Every value crossing an edge is one of three kinds:

* **data** — ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``,
  ``tuple``, ``dict`` (``str``/``int`` keys), nested. It has a canonical encoding
  that is injective, type-tagged and length-prefixed, so ``digest`` is a content key.
* **codec values** — leaves that a ``Codec`` passed in knows how to write down
  (``somatize.torch`` passes codecs for detached tensors and numpy arrays).
* ``Opaque(x)`` — passed by identity, never hashed, never serialised (``opaque.py``).

The encoding, one tag byte per value, lengths as 8-byte big-endian integers::

    N           None            T / F        True / False
    i len b     int (two's complement, big-endian, minimal length)
    f 8b        float (IEEE 754 big-endian; every NaN written as one canonical NaN)
    s len b     str (UTF-8, surrogates kept)        b len b   bytes
    l n items   list            t n items    tuple
    d n pairs   dict, pairs sorted by the encoded key, so insertion order does not matter
    c len tag len payload       a value written by the codec named ``tag``

``decode`` (in ``decoding.py``) reads it back.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from blake3 import blake3

from .decoding import decode
from .errors import ValueConversionError
from .opaque import Opaque
from .value_reasons import _reason

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["Opaque", "check", "decode", "digest", "encode", "is_data"]

_LEN = struct.Struct(">Q")
_FLOAT = struct.Struct(">d")
_NAN = b"f" + _FLOAT.pack(math.nan)
_INT_SMALL = {i: b"i" + _LEN.pack(1) + i.to_bytes(1, "big", signed=True) for i in range(-128, 128)}


_LENS = [_LEN.pack(i) for i in range(1024)]
_TAGS: dict[str, bytes] = {}  # a codec's tag -> the start of every value it writes
_DATA = frozenset({str, int, float, bool, bytes, list, tuple, dict, type(None)})
_INT_TWO = b"i" + _LEN.pack(2)


class _Slow(Exception):
    """Internal: the value needs the general encoder (a codec leaf, or an error to explain)."""


_KEYS: dict[str, bytes] = {}  # encodings of dict keys (and short str values) seen: they recur
# encodings of the ints that take one or two bytes: those of one made at import, those of
# two as they are met (a lookup costs a third of int.to_bytes)
_INTS: dict[int, bytes] = dict(_INT_SMALL)


def _kept_str(v: str) -> bytes:
    """The encoding of a str, kept when short (a dict key or a short value: they recur)."""
    b = _str(v)
    if len(_KEYS) < 4096 and len(v) <= 64:
        _KEYS[v] = b
    return b


def _int_two(v: int) -> bytes:
    """The encoding of an int of two bytes (-32768 <= v < 32768, not one byte), kept."""
    b = _INT_TWO + v.to_bytes(2, "big", signed=True)
    if len(_INTS) < 8192:
        _INTS[v] = b
    return b


def _str(v: str) -> bytes:
    b = v.encode("utf-8", "surrogatepass")
    n = len(b)
    return b"s" + (_LENS[n] if n < 1024 else _LEN.pack(n)) + b


def _plain(v: Any) -> bytes:
    """The encoding of plain data, fast: bytes are built bottom-up, no codecs, no error paths.

    The common leaves inside a list, tuple or dict (small ints, strings, floats) are written
    in place rather than through a call each; ``_encode`` is the reference it must match.
    """
    t = type(v)
    if t is str:
        return _str(v)
    if t is int:
        if -128 <= v < 128:
            return _INT_SMALL[v]
        if -32768 <= v < 32768:  # the minimal two's complement is exactly two bytes here
            two: bytes = v.to_bytes(2, "big", signed=True)
            return _INT_TWO + two
        b: bytes = v.to_bytes((v + (v < 0)).bit_length() // 8 + 1, "big", signed=True)
        return b"i" + _LEN.pack(len(b)) + b
    if t is float:
        return _NAN if v != v else b"f" + _FLOAT.pack(v)
    if v is None:
        return b"N"
    if t is bool:
        return b"T" if v else b"F"
    if t is list or t is tuple:
        n = len(v)
        out = [(b"l" if t is list else b"t") + (_LENS[n] if n < 1024 else _LEN.pack(n))]
        for x in v:
            tx = type(x)
            if tx is int and -32768 <= x < 32768:
                known = _INTS.get(x)
                out.append(known if known is not None else _int_two(x))
            elif tx is float and x == x:
                out.append(b"f" + _FLOAT.pack(x))
            else:
                out.append(_plain(x))
        return b"".join(out)
    if t is dict:
        pairs = []
        for k, x in v.items():
            if type(k) is str:
                kb = _KEYS.get(k) or _kept_str(k)  # (an encoding is never empty)
            elif type(k) is int:
                kb = _plain(k)
            else:
                raise _Slow
            tx = type(x)
            if tx is str:
                pairs.append(kb + (_KEYS.get(x) or _kept_str(x)))
            elif tx is float and x == x:
                pairs.append(kb + b"f" + _FLOAT.pack(x))
            else:
                pairs.append(kb + _plain(x))
        # Sorting key+value strings orders them by key: distinct keys' encodings differ
        # within their common length (tag, then length prefix, then bytes), never by prefix.
        pairs.sort()
        n = len(pairs)
        return b"d" + (_LENS[n] if n < 1024 else _LEN.pack(n)) + b"".join(pairs)
    if t is bytes:
        return b"b" + _LEN.pack(len(v)) + bytes(v)
    raise _Slow


def _first(pair: tuple[bytes, Any]) -> bytes:
    return pair[0]


class _Sink(Protocol):
    def __call__(self, chunk: bytes | memoryview, /) -> object: ...


class _Reject(Exception):
    """Internal: a value inside a larger value cannot be encoded; carries its path."""

    def __init__(self, reason: str, as_input: str | None = None) -> None:
        self.reason = reason
        self.as_input = as_input  # a codec's reason for the graph input, if it words one
        self.path: list[str] = []


def _encode(value: Any, out: _Sink, codecs: Sequence[Codec]) -> None:
    t = type(value)
    if t is str:
        b = value.encode("utf-8", "surrogatepass")
        out(b"s" + _LEN.pack(len(b)) + b)
    elif t is int:
        small = _INT_SMALL.get(value)
        if small is not None:
            out(small)
        else:
            b = value.to_bytes((value + (value < 0)).bit_length() // 8 + 1, "big", signed=True)
            out(b"i" + _LEN.pack(len(b)) + b)
    elif t is float:
        out(_NAN if value != value else b"f" + _FLOAT.pack(value))
    elif value is None:
        out(b"N")
    elif t is bool:
        out(b"T" if value else b"F")
    elif t is bytes:
        out(b"b" + _LEN.pack(len(value)))
        out(value)
    elif t is list or t is tuple:
        out((b"l" if t is list else b"t") + _LEN.pack(len(value)))
        for i, item in enumerate(value):
            try:
                _encode(item, out, codecs)
            except _Reject as r:
                r.path.append(f"[{i}]")
                raise
    elif t is dict:
        pairs = []
        for k, v in value.items():
            if type(k) is str:
                kb = k.encode("utf-8", "surrogatepass")
                kb = b"s" + _LEN.pack(len(kb)) + kb
            elif type(k) is int:
                key_chunks: list[bytes | memoryview] = []
                _encode(k, key_chunks.append, codecs)
                kb = bytes(key_chunks[0])
            else:
                raise _Reject(
                    f"a dict key {k!r} of type {type(k).__name__}; "
                    "dict keys must be str or int — convert the keys, or wrap the dict in Opaque(...)"
                )
            val_chunks: list[bytes | memoryview] = []
            try:
                _encode(v, val_chunks.append, codecs)
            except _Reject as r:
                r.path.append(f"[{k!r}]")
                raise
            pairs.append((kb, val_chunks))
        pairs.sort(key=_first)
        out(b"d" + _LEN.pack(len(pairs)))
        for kb, vcs in pairs:
            out(kb)
            for c in vcs:
                out(c)
    else:
        for codec in codecs:
            if codec.accepts(value):
                try:
                    chunks = list(codec.chunks(value))
                except ValueConversionError as e:
                    raise _Reject(str(e), e.as_input) from None
                tag = codec.tag.encode()
                size = sum(c.nbytes if isinstance(c, memoryview) else len(c) for c in chunks)
                out(b"c" + _LEN.pack(len(tag)) + tag + _LEN.pack(size))
                for c in chunks:
                    out(c)
                return
        raise _Reject(_reason(value))


def _too_deep(where: str) -> ValueConversionError:
    return ValueConversionError(
        f"{where}: cannot pass a value that contains itself or is nested too deeply "
        "(a list, tuple or dict reached again inside itself); pass a copy without the "
        "cycle, or wrap it in Opaque(...)"
    )


def _convert(fn: Callable[[], Any], where: str) -> Any:
    try:
        return fn()
    except RecursionError:
        raise _too_deep(where) from None
    except _Reject as r:
        at = "".join(reversed(r.path))
        reason = r.as_input if r.as_input is not None and "graph input" in where else r.reason
        raise ValueConversionError(
            f"{where}{' at ' + at if at else ''}: cannot pass {reason}"
        ) from None


def encode(value: Any, codecs: Sequence[Codec] = (), where: str = "value") -> bytes:
    """The canonical bytes of a data value.

    Args:
        value: plain data, possibly holding leaves that one of ``codecs`` accepts.
        codecs: codecs for leaves that are not plain data (tensors, arrays).
        where: what the value is, for error messages (``"output of node 'enc'"``).

    Raises:
        ValueConversionError: naming ``where``, the offending part and the fix.

    Example:
        >>> encode(1) != encode(1.0) != encode(True)
        True
    """
    try:
        return _plain(value)
    except _Slow:
        pass
    except RecursionError:
        raise _too_deep(where) from None
    out: list[bytes | memoryview] = []
    _convert(lambda: _encode(value, out.append, codecs), where)
    return b"".join(out)


def digest(value: Any, codecs: Sequence[Codec] = (), where: str = "value") -> str:
    """The content key of a data value: blake3 of its canonical encoding, as 64 hex digits.

    A lone codec value takes its codec's own key where the codec has one (``Codec``: a
    tensor's is keyed blake3 of its bytes under a key made of its dtype and shape). Large
    codec payloads (tensor bytes) are fed to blake3 without being copied.

    Example:
        >>> digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
        True
    """
    if type(value) in _DATA:
        try:
            return blake3(_plain(value)).digest().hex()  # (hexdigest() costs 0.1 µs more)
        except _Slow:
            pass
        except RecursionError:
            raise _too_deep(where) from None
    else:  # one codec leaf (a tensor): the codec's own key, or straight to its chunks
        for codec in codecs:
            if codec.accepts(value):
                own = getattr(codec, "key", None)
                if own is not None:
                    got: str | None = own(value)
                    if got is not None:
                        return got
                try:
                    chunks = [b"", *codec.chunks(value)]
                except ValueConversionError:
                    break  # the general path below words the error
                size = 0
                for c in chunks:
                    size += c.nbytes if type(c) is memoryview else len(c)
                tag = _TAGS.get(codec.tag)
                if tag is None:
                    raw_tag = codec.tag.encode()
                    tag = _TAGS[codec.tag] = b"c" + _LEN.pack(len(raw_tag)) + raw_tag
                chunks[0] = tag + _LEN.pack(size)
                if size <= 65536:  # one update: copying a small payload costs less than a call
                    return blake3(b"".join(chunks)).digest().hex()
                h = blake3(chunks.pop(0))
                for c in chunks:
                    h.update(c)
                return h.hexdigest()
    out: list[bytes | memoryview] = []
    _convert(lambda: _encode(value, out.append, codecs), where)
    h = blake3()
    small: list[bytes | memoryview] = []
    for chunk in out:  # one update for runs of small chunks; large buffers go in uncopied
        if isinstance(chunk, memoryview) and chunk.nbytes > 4096:
            if small:
                h.update(b"".join(small))
                small.clear()
            h.update(chunk)
        else:
            small.append(chunk)
    if small:
        h.update(b"".join(small))
    return h.hexdigest()


def is_data(value: Any, codecs: Sequence[Codec] = ()) -> bool:
    """Whether ``value`` can cross an edge as data (with ``codecs`` for non-plain leaves)."""
    if type(value) not in _DATA and not any(c.accepts(value) for c in codecs):
        return False  # a module, an object: no reason to word, no exception to raise
    try:
        _check(value, codecs)
    except (_Reject, RecursionError):
        return False
    return True


def _check(value: Any, codecs: Sequence[Codec]) -> None:
    t = type(value)
    if t is str or t is int or t is float or t is bool or t is bytes or value is None:
        return
    if t is list or t is tuple:
        for i, item in enumerate(value):
            try:
                _check(item, codecs)
            except _Reject as r:
                r.path.append(f"[{i}]")
                raise
        return
    if t is dict:
        for k, v in value.items():
            if type(k) is not str and type(k) is not int:
                raise _Reject(
                    f"a dict key {k!r} of type {type(k).__name__}; "
                    "dict keys must be str or int — convert the keys, or wrap the dict in Opaque(...)"
                )
            try:
                _check(v, codecs)
            except _Reject as r:
                r.path.append(f"[{k!r}]")
                raise
        return
    for codec in codecs:
        if codec.accepts(value):
            try:
                codec.check(value)
            except ValueConversionError as e:
                raise _Reject(str(e), e.as_input) from None
            return
    raise _Reject(_reason(value))


def check(value: Any, codecs: Sequence[Codec] = (), where: str = "value") -> None:
    """Validate that ``value`` is data, without encoding it.

    Raises:
        ValueConversionError: naming ``where``, the offending part and the fix.
    """
    _convert(lambda: _check(value, codecs), where)
