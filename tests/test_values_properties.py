"""The canonical encoding's properties (hypothesis): bytes equal exactly when values are
equal, round trips, the digest is blake3 of the encoding, the fast encoder equals the
reference one."""

from __future__ import annotations

import math
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from somatize import decode, digest, encode
from tests.value_floats import NAN_PAYLOAD, NANS, bits


def same(a: Any, b: Any) -> bool:
    """Reference equality, type-aware: what the encoding must tell apart (and only that)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or bits(a) == bits(b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:  # keys are str or int only, so set equality of keys is type-aware
        return set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def rebuild(v: Any) -> Any:
    """An equal value made of fresh objects: dicts in reverse order, every NaN another NaN."""
    t = type(v)
    if t is float:
        return NAN_PAYLOAD if math.isnan(v) else struct.unpack(">d", bits(v))[0]
    if t is int:
        return int(str(v))
    if t is str:
        return "".join(list(v))
    if t is bytes:
        return bytes(bytearray(v))
    if t is list:
        return [rebuild(x) for x in v]
    if t is tuple:
        return tuple(rebuild(x) for x in v)
    if t is dict:
        return {rebuild(k): rebuild(v[k]) for k in reversed(list(v))}
    return v


# A small domain, so that independently drawn pairs are often equal, often nearly so.
small_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.0, -0.0, 1.0, 2.0, math.inf, -math.inf, *NANS]),
    st.sampled_from(["", "1", "a", "é", "\ud800"]),
    st.sampled_from([b"", b"1", b"a"]),
)
small_key = st.one_of(st.integers(-2, 2), st.sampled_from(["", "1", "a"]))
small = st.recursive(
    small_leaf,
    lambda c: st.one_of(
        st.lists(c, max_size=3),
        st.lists(c, max_size=3).map(tuple),
        st.dictionaries(small_key, c, max_size=3),
    ),
    max_leaves=6,
)

# The whole range: big ints, any float, any text (surrogates too), any bytes.
wide_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**300), max_value=2**300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(NANS),
    st.text(st.characters(exclude_categories=()), max_size=8),
    st.binary(max_size=16),
)
wide = st.recursive(
    wide_leaf,
    lambda c: st.one_of(
        st.lists(c, max_size=4),
        st.lists(c, max_size=4).map(tuple),
        st.dictionaries(st.one_of(st.integers(), st.text(max_size=4)), c, max_size=4),
    ),
    max_leaves=12,
)


# -- properties ---------------------------------------------------------------------------


@settings(max_examples=2500)
@given(small, small)
def test_bytes_equal_exactly_when_values_equal(a: Any, b: Any) -> None:
    assert (encode(a) == encode(b)) == same(a, b)
    assert (digest(a) == digest(b)) == same(a, b)


@settings(max_examples=1000)
@given(wide, wide)
def test_distinct_values_give_distinct_bytes(a: Any, b: Any) -> None:
    assert (encode(a) == encode(b)) == same(a, b)


@settings(max_examples=1000)
@given(wide)
def test_equal_values_give_equal_bytes(a: Any) -> None:
    b = rebuild(a)
    assert same(a, b)
    assert encode(a) == encode(b)
    assert digest(a) == digest(b)


@settings(max_examples=1000)
@given(wide)
def test_decode_round_trips(a: Any) -> None:
    data = encode(a)
    back = decode(data)
    assert same(back, a)
    assert encode(back) == data


@settings(max_examples=300)
@given(wide)
def test_digest_is_blake3_of_encoding(a: Any) -> None:
    from blake3 import blake3

    assert digest(a) == blake3(encode(a)).hexdigest()


@settings(max_examples=500)
@given(wide)
def test_the_fast_encoder_writes_what_the_reference_encoder_writes(a: Any) -> None:
    from somatize.values import _encode, _plain

    out: list[Any] = []
    _encode(a, out.append, ())
    assert _plain(a) == b"".join(bytes(c) for c in out)


def test_the_fast_encoders_kept_encodings_are_the_reference_encoders() -> None:
    """Two-byte ints in a list and short str values in a dict are kept once encoded (what
    the second call reads): both calls write what the reference encoder writes."""
    from somatize.values import _encode, _plain

    ints = [-32768, -129, -128, 127, 128, 255, 256, 2023, 32767, 32768, -32769]
    value = {"ids": ints, "lang": "en", "text": "x" * 65, "empty": "", "ünï": "cödé"}
    out: list[Any] = []
    _encode(value, out.append, ())
    reference = b"".join(bytes(c) for c in out)
    assert _plain(value) == _plain(value) == reference
    assert _plain(ints) == _plain(ints) and decode(_plain(ints)) == ints
