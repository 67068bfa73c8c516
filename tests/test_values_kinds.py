"""What crosses the conversion boundary besides plain data: rejected kinds named with the
edge and the fix, codec values carrying their tag, and Opaque."""

from __future__ import annotations

import collections
import enum
import pickle
from typing import Any

import pytest

from somatize import DataCodec, Opaque, ValueConversionError, decode, digest, encode
from somatize.values import check, is_data
from tests.fakes import FakeCodec, FakeTensor

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
