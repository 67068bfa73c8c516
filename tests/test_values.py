"""The conversion boundary: the canonical encoding in the cases the design names, its digest
(pinned, independent of PYTHONHASHSEED), and decode refusing damaged bytes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from somatize import decode, digest, encode
from tests.value_floats import NANS, bits

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


def test_decode_rejects_trailing_and_unknown_bytes() -> None:
    with pytest.raises(ValueError, match="trailing"):
        decode(encode(1) + b"N")
    with pytest.raises(ValueError, match="unknown tag .* not .* what somatize.encode wrote"):
        decode(b"z" + (0).to_bytes(8, "big"))
    with pytest.raises(ValueError, match="truncated encoded value: 3 bytes announced, 2 left"):
        decode(encode("abc")[:-1])


def test_decode_names_the_codec_a_value_needs_and_how_to_pass_it() -> None:
    leaf = b"c" + (4).to_bytes(8, "big") + b"mine" + (0).to_bytes(8, "big")  # codec 'mine'
    with pytest.raises(ValueError, match=r"codec 'mine', which was not passed; .*codecs=\["):
        decode(leaf)


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
