"""Codecs: writing down values that are not plain data.

A codec teaches the engine one more kind of leaf value: how to recognise it, check
it, write it as bytes (for keys and keepers) and read it back. Codecs are passed
explicitly — to ``Graph(codecs=...)``, ``encode``, ``digest`` — never registered
globally; ``somatize.torch`` passes its tensor and ndarray codecs by default.

A codec may also *fingerprint* objects a node holds (a module's weights): that is
how a node's state enters its key. Optionally, a codec has ``key(value) -> str | None``:
the key ``digest`` gives a lone value of its own (a value inside a list, tuple or dict
enters by its encoding). It must depend on the value's content alone, be the same in
every process, and differ from the key of any other value — ``somatize.torch`` hashes a
tensor's bytes with keyed blake3 under a key made of its dtype and shape — and cover
every value the codec writes; None where the value cannot be data (``digest`` then goes
down the general path, which words why). Without ``key``, a lone value's key is blake3
of its encoding. And optionally
``context() -> data | None``: what every node's output depends on besides its state and
inputs (``somatize.torch``: the autocast dtype), entered into every node key when not None.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .values import check, decode, digest, encode, is_data

__all__ = ["Codec", "DataCodec", "check_codecs"]


@runtime_checkable
class Codec(Protocol):
    """The shape of a codec. Implementations match by shape; no base class needed.

    Attributes:
        tag: a short unique name written before every value this codec encodes.
    """

    tag: str

    def accepts(self, value: Any) -> bool:
        """Whether this codec writes ``value`` (cheap: a type test)."""
        ...

    def check(self, value: Any) -> None:
        """Raise ``ValueConversionError`` (reason and fix) if ``value`` cannot be data."""
        ...

    def chunks(self, value: Any) -> Iterable[bytes | memoryview]:
        """The payload, as chunks hashed and stored without copying large buffers."""
        ...

    def decode(self, payload: bytes) -> Any:
        """The value back from its payload."""
        ...

    def fingerprint(self, obj: Any) -> str | None:
        """A digest of an object held by a node (its state), or None if not this codec's."""
        ...


_METHODS = ("accepts", "check", "chunks", "decode", "fingerprint")


def check_codecs(codecs: Any, where: str) -> tuple[Codec, ...]:
    """``codecs`` as a tuple, each checked to have the ``Codec`` protocol's members.

    Raises:
        TypeError: naming ``where`` and the value that is not a codec, or what it lacks.
    """
    if isinstance(codecs, (str, bytes)) or not isinstance(codecs, Iterable):
        raise TypeError(
            f"{where}: codecs is a sequence of codecs, not {codecs!r}; e.g. "
            "codecs=[st.TensorCodec()] (a codec has tag, accepts, check, chunks, decode "
            "and fingerprint: see somatize.codecs.Codec)"
        )
    out = tuple(codecs)
    for c in out:
        lacks = [m for m in _METHODS if not callable(getattr(c, m, None))]
        if not isinstance(getattr(c, "tag", None), str):
            lacks.insert(0, "tag (a str)")
        if lacks:
            raise TypeError(
                f"{where}: {c!r} is not a codec: it lacks {', '.join(lacks)}. A codec has "
                "a str tag and methods accepts, check, chunks, decode and fingerprint (see "
                "somatize.codecs.Codec), e.g. codecs=[st.TensorCodec()]"
            )
    return out


class DataCodec:
    """The codec of plain data, over the canonical encoding of ``somatize.values``.

    Example:
        >>> c = DataCodec()
        >>> c.decode(b"".join(c.chunks({"a": [1, 2.5]})))
        {'a': [1, 2.5]}
    """

    tag = "data"

    def accepts(self, value: Any) -> bool:
        return is_data(value)

    def check(self, value: Any) -> None:
        check(value)

    def chunks(self, value: Any) -> Iterable[bytes | memoryview]:
        return (encode(value),)

    def decode(self, payload: bytes) -> Any:
        return decode(payload)

    def fingerprint(self, obj: Any) -> str | None:
        return digest(obj) if is_data(obj) else None
