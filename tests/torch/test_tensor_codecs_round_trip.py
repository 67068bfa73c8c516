"""Tensor and ndarray codecs: keys of every dtype and layout against keyed blake3 by hand,
round trips (alone, inside data, as a property), and tensors stored by a DiskKeeper without
pickle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch import nn

from somatize import DiskKeeper, Done, Graph, Node, encode
from somatize.torch import TensorCodec
from tests.torch.codec_helpers import key, round_trip

# -- round trips ------------------------------------------------------------------------

TENSORS = {
    "float32": torch.randn(3, 4),
    "float64": torch.randn(2, 2, dtype=torch.float64),
    "float16": torch.randn(5, dtype=torch.float16),
    "bfloat16": torch.randn(2, 3).to(torch.bfloat16),
    "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
    "int64": torch.tensor([2**62, -(2**62)]),
    "uint8": torch.tensor([0, 255], dtype=torch.uint8),
    "bool": torch.tensor([[True, False], [False, True]]),
    "complex64": torch.complex(torch.randn(3), torch.randn(3)),
    "0-d": torch.tensor(3.5),
    "empty": torch.empty(0, 4),
    "non-contiguous": torch.arange(24.0).reshape(4, 6)[:, ::2].T,
    "conj view": torch.complex(torch.randn(2), torch.randn(2)).conj(),
    "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
}


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_a_tensor_key_is_keyed_blake3_of_its_documented_bytes(name):
    """The key of a lone tensor against keyed blake3 over its bytes written out by hand:
    every dtype and layout, views included, the first time and once its layout is known."""
    t = TENSORS[name]
    raw = t.resolve_conj().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    layout = encode(("somatize.tensor/2", str(t.dtype).removeprefix("torch."), tuple(t.shape)))
    expected = blake3(raw, key=blake3(layout).digest()).hexdigest()
    assert key(t) == expected
    assert key(t) == expected


def test_the_codec_key_covers_every_tensor_that_is_data_or_steps_aside():
    c = TensorCodec()
    big = torch.randn(70_000)  # past the pointer road's size
    for t in (big, *TENSORS.values()):
        assert c.key(t) == key(t) == key(t.resolve_conj().contiguous())
    assert c.key(torch.ones(2, requires_grad=True)) is None  # the general path words why


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_tensor_round_trip(name):
    t = TENSORS[name]
    back = round_trip(t)
    assert back.dtype == t.dtype and back.shape == t.shape and back.device.type == "cpu"
    same_bytes = t.resolve_conj().contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(back.reshape(-1).view(torch.uint8), same_bytes)
    if t.numel():
        back.view(-1)[0] = back.view(-1)[-1]  # writable, and not tied to the encoded bytes


def test_tensors_inside_data_round_trip():
    value = {"ids": torch.arange(3), "rows": [torch.ones(2), (torch.zeros(1), "x")], "n": 2}
    back = round_trip(value)
    assert torch.equal(back["ids"], value["ids"])
    assert torch.equal(back["rows"][0], torch.ones(2))
    assert back["rows"][1][1] == "x" and back["n"] == 2


ARRAYS = {
    "float32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "big-endian": np.arange(4, dtype=">i4"),
    "bool": np.array([True, False]),
    "0-d": np.array(2.5),
    "empty": np.zeros((0, 3)),
    "non-contiguous": np.arange(12).reshape(3, 4).T,
    "unicode": np.array(["a", "bc"]),
    "scalar float32": np.float32(1.5),
    "scalar int64": np.int64(-3),
    "scalar bool": np.bool_(True),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_ndarray_and_numpy_scalar_round_trip(name):
    a = ARRAYS[name]
    back = round_trip(a)
    assert type(back) is type(a)
    assert back.dtype == a.dtype and back.shape == a.shape
    assert np.array_equal(back, a)


@settings(max_examples=60, deadline=None)
@given(
    dtype=hs.sampled_from([torch.float32, torch.int16, torch.bool, torch.bfloat16, torch.uint8]),
    shape=hs.lists(hs.integers(0, 4), max_size=3),
    seed=hs.integers(0, 2**16),
)
def test_tensor_round_trip_property(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * 100).to(dtype)
    back = round_trip(t)
    assert back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back, t)
    assert key(back) == key(t)


# -- keepers hold bytes -----------------------------------------------------------------


def test_cached_tensor_output_survives_a_disk_keeper_without_pickle(tmp_path):
    from somatize.torch import module

    class Embed(Node):
        calls = 0

        def __init__(self) -> None:
            torch.manual_seed(0)
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids, ctx):
            Embed.calls += 1
            return Done(self.emb(ids).detach())

    def build():
        g = Graph.somatize(Embed().with_id("emb"), keeper=DiskKeeper(tmp_path / "store"))
        return g.freeze("emb").cache("emb")

    ids = torch.tensor([1, 2, 3])
    first = module(build())(ids)
    later = module(build())(ids)  # another graph, same store: a hit
    assert Embed.calls == 1
    assert torch.equal(first, later)
    stored = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert stored and not any(b"torch._utils" in p.read_bytes() for p in stored)
