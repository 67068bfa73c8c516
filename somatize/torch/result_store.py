"""A remembered run's ``TrainResult`` as bytes and back: field by field through the codecs,
never pickled (``st.remember`` stores it in its keeper under the run's key)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ValueConversionError
from ..values import decode, encode, is_data
from .result import TrainResult

__all__ = ["FIELDS", "FORMAT", "RememberedResult", "decode_result", "encode_result"]

FORMAT = "somatize.train-result/1"


@dataclass(frozen=True, repr=False)
class RememberedResult(TrainResult):
    """A ``TrainResult`` from a remembered run, saying where it came from.

    Attributes:
        recalled: True when it was read back from the keeper without running.
        key: the run's key (``somatize runs show KEY``).
    """

    recalled: bool = False
    key: str = ""

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + (", recalled)" if self.recalled else ")")


FIELDS = tuple(f for f in dataclasses.fields(TrainResult))


def encode_result(result: TrainResult, codecs: Sequence[Any]) -> bytes:
    """A ``TrainResult`` as bytes, field by field through the codecs (never pickled)."""
    values = {}
    for f in FIELDS:
        v = getattr(result, f.name)
        if isinstance(v, Mapping):
            v = dict(v)
        elif isinstance(v, os.PathLike):  # a checkpoint's path comes back as a str
            v = os.fspath(v)
        if not is_data(v, codecs):
            raise ValueConversionError(
                f"field {f.name!r} of the TrainResult holds a value of type {type(v).__qualname__}, "
                "which is not data, so the result cannot be written down (it is never pickled); keep "
                "numbers, strings, lists, dicts and tensors in a TrainResult's fields"
            )
        values[f.name] = v
    return encode({"format": FORMAT, "fields": values}, codecs, where="the TrainResult")


def decode_result(data: bytes, codecs: Sequence[Any], key: str) -> RememberedResult | None:
    """The result back, or None when it was written by a TrainResult with other fields."""
    try:
        stored = decode(data, codecs)
    except ValueError:
        return None
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        return None
    values = stored["fields"]
    has_default = dataclasses.MISSING
    for f in FIELDS:
        if f.name not in values and f.default is has_default and f.default_factory is has_default:
            return None  # a field this TrainResult needs was not written: not this result
    known = {f.name for f in FIELDS}
    return RememberedResult(
        **{k: v for k, v in values.items() if k in known}, recalled=True, key=key
    )
