"""The conversion boundary: the canonical encoding, its digest, rejected kinds, Opaque."""

from __future__ import annotations

import collections
import enum
import json
import math
import pickle
import struct
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somatize import DataCodec, Opaque, ValueConversionError, decode, digest, encode
from somatize.values import check, is_data
from tests.fakes import FakeCodec, FakeTensor

NAN_PAYLOAD = struct.unpack(">d", b"\x7f\xf8\x00\x00\x00\x00\x00\x2a")[0]
NAN_SIGNALLING = struct.unpack(">d", b"\x7f\xf0\x00\x00\x00\x00\x00\x01")[0]
NANS = [math.nan, -math.nan, NAN_PAYLOAD, NAN_SIGNALLING, float("inf") - float("inf")]


def bits(f: float) -> bytes:
    return struct.pack(">d", f)


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


# -- the cases the design names -----------------------------------------------------------


def test_one_one_point_oh_true_and_string_one_all_differ() -> None:
    values = [1, 1.0, True, "1", b"1", [1], (1,), {"1": 1}, None, 0, False]
    encodings = {encode(v) for v in values}
    assert len(encodings) == len(values)


def test_list_and_tuple_differ_also_when_empty_or_nested() -> None:
    assert encode([1, 2]) != encode((1, 2))
    assert encode([]) != encode(())
    assert encode([[1]]) != encode([(1,)])
    assert encode({}) != encode([])


def test_negative_zero_differs_from_zero() -> None:
    assert encode(-0.0) != encode(0.0)
    assert math.copysign(1.0, decode(encode(-0.0))) == -1.0


def test_every_nan_encodes_alike() -> None:
    assert len({bits(n) for n in NANS}) > 1  # the NaNs really differ in their bits
    assert len({encode(n) for n in NANS}) == 1
    assert len({digest([n, {"x": n}]) for n in NANS}) == 1
    assert encode(math.nan) != encode(math.inf)


def test_dict_insertion_order_does_not_matter() -> None:
    a = {"b": 1, "a": 2, 3: [1], -1: None}
    b = {-1: None, 3: [1], "a": 2, "b": 1}
    assert list(a) != list(b)
    assert encode(a) == encode(b)
    assert encode({"a": 1}) != encode({"a": 2})
    assert encode({1: "x"}) != encode({"1": "x"})


@pytest.mark.parametrize(
    "n",
    [127, 128, -128, -129, 255, 256, 2**63 - 1, 2**63, 2**64, -(2**64), 2**1000, -(2**1000) + 1],
)
def test_big_ints_round_trip_and_stay_distinct(n: int) -> None:
    assert decode(encode(n)) == n
    assert encode(n) != encode(n + 1)
    assert encode(n) != encode(-n)


def test_strings_keep_lone_surrogates_and_differ_from_bytes() -> None:
    s = "a\ud800b"
    assert decode(encode(s)) == s
    assert encode("é") != encode("é".encode())


def test_digest_is_pinned() -> None:
    # A change here changes every key ever written: bump KEY_VERSION if it is deliberate.
    pinned = "998eabbe9d5f59dad435d48dac9e4ab0667c2220acbd3bafe25cfa0046d80f03"
    assert digest({"b": [1, 2.5, "x"], "a": (None, True, b"\x00")}) == pinned
    assert encode([1, "a"]) == (
        b"l" + (2).to_bytes(8, "big") + b"i" + (1).to_bytes(8, "big") + b"\x01"
        b"s" + (1).to_bytes(8, "big") + b"a"
    )


@pytest.mark.slow
def test_digests_do_not_depend_on_pythonhashseed(subprocess_env: dict[str, str]) -> None:
    script = r"""
import json
from somatize import digest
words = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
         "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau"}
d = {w: len(w) for w in words}          # insertion order follows the string hash seed
values = [d, sorted(words), {"nested": d, 1: [d, (d,)]}, "text", 2**100, -0.0, float("nan")]
print(json.dumps({"order": list(d), "digests": [digest(v) for v in values]}))
"""
    runs = []
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", script],
            env={**subprocess_env, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        runs.append(json.loads(out.stdout))
    assert runs[0]["order"] != runs[1]["order"]  # the dicts really were built in other orders
    assert runs[0]["digests"] == runs[1]["digests"]
    words = runs[0]["order"]
    here = {w: len(w) for w in words}
    assert runs[0]["digests"][0] == digest(here)


# -- rejected kinds -----------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


Point = collections.namedtuple("Point", "x y")


def _gen() -> Any:
    yield 1


REJECTED = [
    pytest.param({1, 2}, ["set", "sorted(", "Opaque("], id="set"),
    pytest.param(frozenset({1}), ["frozenset", "sorted(", "Opaque("], id="frozenset"),
    pytest.param(_gen(), ["generator", "list(...)"], id="generator"),
    pytest.param(iter([1]), ["iterator", "list(...)"], id="iterator"),
    pytest.param(object(), ["object", "Opaque("], id="object"),
    pytest.param({(1, 2): 3}, ["dict key (1, 2)", "str or int"], id="tuple-key"),
    pytest.param({1.5: 3}, ["dict key 1.5", "str or int"], id="float-key"),
    pytest.param({True: 3}, ["dict key True", "str or int"], id="bool-key"),
    pytest.param([Opaque(1)], ["Opaque inside a data value", "Opaque((a, b))"], id="nested-opaque"),
    pytest.param(Point(1, 2), ["Point", "subclass of tuple", "tuple(...)"], id="namedtuple"),
    pytest.param(Color.RED, ["Color", "subclass of int", "int(...)"], id="intenum"),
    pytest.param(Name("x"), ["Name", "subclass of str", "str(...)"], id="str-subclass"),
    pytest.param(bytearray(b"x"), ["bytearray", "bytes(...)"], id="bytearray"),
]


@pytest.mark.parametrize(("value", "fragments"), REJECTED)
@pytest.mark.parametrize("fn", [encode, digest, check])
def test_rejected_kinds_name_the_edge_and_the_fix(
    value: Any, fragments: list[str], fn: Any
) -> None:
    with pytest.raises(ValueConversionError) as info:
        fn(value, where="the output of node 'enc'")
    message = str(info.value)
    assert message.startswith("the output of node 'enc'")
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, TypeError)
    assert not is_data(value)


def test_a_rejected_part_deep_inside_is_located() -> None:
    with pytest.raises(ValueConversionError, match=r"at \['a'\]\[1\]\[0\]: cannot pass a set"):
        encode({"a": [1, ({2},)]}, where="x")
    with pytest.raises(ValueConversionError, match=r"at \[2\]\['k'\]"):
        check([0, 1, {"k": object()}], where="x")


# -- codecs -------------------------------------------------------------------------------


def test_codec_values_encode_decode_and_carry_their_tag() -> None:
    codec = FakeCodec()
    value = {"w": FakeTensor(b"\x01\x02"), "n": 3}
    data = encode(value, [codec])
    back = decode(data, [codec])
    assert back == value
    assert encode(FakeTensor(b"ab"), [codec]) != encode(b"ab")
    assert encode(FakeTensor(b"ab"), [codec]) != encode(FakeTensor(b"ac"), [codec])
    assert digest(value, [codec]) == digest({"n": 3, "w": FakeTensor(b"\x01\x02")}, [codec])
    with pytest.raises(ValueError, match="codec 'fake'"):
        decode(data)  # without the codec that wrote it


def test_codec_refusal_names_the_edge() -> None:
    codec = FakeCodec()
    bad = FakeTensor(b"x", requires_grad=True)
    for fn in (encode, check):
        with pytest.raises(ValueConversionError, match=r"node 'enc'.*\[0\].*wrap it in Opaque"):
            fn([bad], [codec], where="the output of node 'enc'")
    with pytest.raises(ValueConversionError, match="FakeTensor"):
        encode(FakeTensor(b"x"), where="v")  # no codec given: an arbitrary object


def test_data_codec_round_trips_and_fingerprints() -> None:
    c = DataCodec()
    v = {"a": [1, 2.5, None]}
    assert c.decode(b"".join(bytes(x) for x in c.chunks(v))) == v
    assert c.accepts(v) and not c.accepts({1, 2})
    assert c.fingerprint(v) == digest(v)
    assert c.fingerprint(object()) is None
    with pytest.raises(ValueConversionError):
        c.check({1})


def test_decode_rejects_trailing_and_unknown_bytes() -> None:
    with pytest.raises(ValueError, match="trailing"):
        decode(encode(1) + b"N")
    with pytest.raises(ValueError, match="unknown tag"):
        decode(b"z" + (0).to_bytes(8, "big"))


# -- Opaque -------------------------------------------------------------------------------


def test_opaque_holds_by_identity_and_never_nests() -> None:
    x = [1, 2]
    o = Opaque(x)
    assert o.value is x
    assert Opaque(o).value is x
    assert o != Opaque(x)  # compared by identity, not by value
    assert repr(o) == "Opaque(list)"
    assert not is_data(o)


def test_opaque_cannot_be_pickled() -> None:
    with pytest.raises(ValueConversionError, match="by identity"):
        pickle.dumps(Opaque([1]))


def test_in_decoded_order_gives_dicts_the_order_decode_gives_them():
    from somatize.decoding import in_decoded_order

    value = {"zz": 1, "a": [{"y": 2, "bb": 3}, (4, {"q": 5, "p": 6})], 7: "int key"}
    ordered = in_decoded_order(value)
    back = decode(encode(value))
    assert ordered == value == back
    assert list(ordered) == list(back)
    assert list(ordered["a"][0]) == list(back["a"][0])
    assert list(ordered["a"][1][1]) == list(back["a"][1][1])


@pytest.mark.parametrize(
    "data",
    [b"l\x00", b"d" + (1).to_bytes(8, "big") + encode([1]) + encode(2), b"f\x00\x01", b""],
)
def test_decode_of_damaged_bytes_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode(data)
