"""Test doubles: a tensor-like value with a version counter, and a codec for it.

``FakeCodec`` is shaped like ``somatize.Codec`` (no base class) and counts how often it
hashes a payload (expensive) versus returns a digest it remembered (cheap), the way the
torch codec remembers a tensor's digest by its version counter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from blake3 import blake3

from somatize import ValueConversionError


class FakeTensor:
    """Bytes with a version counter bumped by every in-place change (like torch's)."""

    def __init__(self, data: bytes, requires_grad: bool = False) -> None:
        self.data = bytearray(data)
        self.version = 0
        self.requires_grad = requires_grad

    def add_(self, delta: int) -> FakeTensor:
        self.data = bytearray((b + delta) % 256 for b in self.data)
        self.version += 1
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeTensor) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]


class FakeCodec:
    tag = "fake"

    def __init__(self) -> None:
        self.hashed = 0  # expensive: a payload digested
        self.remembered = 0  # cheap: a digest served from the memo
        self._memo: dict[int, tuple[FakeTensor, int, str]] = {}

    def accepts(self, value: Any) -> bool:
        return type(value) is FakeTensor

    def check(self, value: Any) -> None:
        if value.requires_grad:
            raise ValueConversionError(
                "a FakeTensor that requires grad; wrap it in Opaque or detach it"
            )

    def chunks(self, value: Any) -> Iterable[bytes | memoryview]:
        self.check(value)
        return (memoryview(bytes(value.data)),)

    def decode(self, payload: bytes) -> Any:
        return FakeTensor(payload)

    def fingerprint(self, obj: Any) -> str | None:
        if type(obj) is not FakeTensor:
            return None
        seen = self._memo.get(id(obj))
        if seen is not None and seen[0] is obj and seen[1] == obj.version:
            self.remembered += 1
            return seen[2]
        self.hashed += 1
        fp = blake3(bytes(obj.data)).hexdigest()
        self._memo[id(obj)] = (obj, obj.version, fp)
        return fp
