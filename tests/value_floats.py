"""The floats the value tests share (tests/test_values*.py): NaNs of other bits, and a
float's bits."""

from __future__ import annotations

import math
import struct

NAN_PAYLOAD = struct.unpack(">d", b"\x7f\xf8\x00\x00\x00\x00\x00\x2a")[0]
NAN_SIGNALLING = struct.unpack(">d", b"\x7f\xf0\x00\x00\x00\x00\x00\x01")[0]
NANS = [math.nan, -math.nan, NAN_PAYLOAD, NAN_SIGNALLING, float("inf") - float("inf")]


def bits(f: float) -> bytes:
    return struct.pack(">d", f)
