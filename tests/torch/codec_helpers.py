"""What the tensor codec tests share (tests/torch/test_tensor_codecs*.py): the torch codecs,
and a value's key and round trip under them."""

from __future__ import annotations

from somatize import decode, digest, encode
from somatize.torch import NdarrayCodec, TensorCodec

CODECS = (TensorCodec(), NdarrayCodec())


def key(value) -> str:
    return digest(value, CODECS)


def round_trip(value):
    return decode(encode(value, CODECS), CODECS)
