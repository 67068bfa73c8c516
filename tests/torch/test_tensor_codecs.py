"""Tensor and ndarray codecs: keys over dtype, shape and bytes; round trips; no copies;
the per-tensor digest memo; refusals with the fix in the message."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch import nn

from somatize import (
    DiskKeeper,
    Done,
    Graph,
    Node,
    ValueConversionError,
    decode,
    digest,
    encode,
)
from somatize.torch import NdarrayCodec, TensorCodec
from somatize.torch.fingerprints import _named_modules

CODECS = (TensorCodec(), NdarrayCodec())


def key(value) -> str:
    return digest(value, CODECS)


def round_trip(value):
    return decode(encode(value, CODECS), CODECS)


# -- keys -------------------------------------------------------------------------------


def test_tensor_key_covers_dtype_shape_and_bytes():
    t = torch.arange(6, dtype=torch.float32)
    same_bytes = [t, t.reshape(2, 3), t.reshape(3, 2), t.view(torch.int32), t.view(torch.uint8)]
    assert len({key(v) for v in same_bytes}) == len(same_bytes)
    changed = t.clone()
    changed[5] = 6.0
    assert key(changed) != key(t)
    assert key(t.clone()) == key(t)  # content, not identity
    nc = torch.arange(12.0).reshape(3, 4).T
    assert not nc.is_contiguous()
    assert key(nc) == key(nc.contiguous())
    assert key(torch.tensor(1.0)) != key(torch.tensor([1.0]))  # 0-d vs one element
    assert key(torch.tensor([0.0])) != key(torch.tensor([-0.0]))


def test_tensor_digest_of_held_state_covers_dtype_shape_and_bytes():
    c = TensorCodec()
    t = torch.arange(6, dtype=torch.float32)
    variants = [t, t.reshape(2, 3), t.view(torch.int32), t + 1]
    assert len({c.digest(v) for v in variants}) == len(variants)


def test_ndarray_key_covers_dtype_shape_bytes_and_scalarness():
    a = np.arange(6, dtype=np.float32)
    same_bytes = [a, a.reshape(2, 3), a.view(np.int32), a.astype(">f4").view("<f4")]
    assert len({key(v) for v in same_bytes}) == len(same_bytes)
    assert key(np.float32(1)) != key(np.array(1, np.float32)) != key(np.array([1], np.float32))
    assert key(np.float32(1)) != key(torch.tensor(1.0))  # the codec tag is in the key
    assert key(a[::2]) == key(np.ascontiguousarray(a[::2]))


def test_key_is_keyed_blake3_over_the_raw_bytes_under_a_key_of_dtype_and_shape():
    """Differential against raw blake3: the raw bytes, keyed by dtype and shape, no pickle;
    the encoding a keeper stores is header and raw bytes."""
    t = torch.randn(3, 5).T  # non-contiguous
    raw = t.contiguous().numpy().tobytes()
    layout = blake3(encode(("somatize.tensor/2", "float32", (5, 3)))).digest()
    assert key(t) == blake3(raw, key=layout).hexdigest()
    header = encode(("float32", (5, 3)))
    payload = struct.pack(">Q", len(header)) + header + raw
    tag = b"torch.tensor"
    framed = b"c" + struct.pack(">Q", len(tag)) + tag + struct.pack(">Q", len(payload))
    assert encode(t, CODECS) == framed + payload
    assert digest([t], CODECS) == blake3(encode([t], CODECS)).hexdigest()  # inside: encoded
    assert TensorCodec().digest(t) == blake3(b"torch.float32(5, 3)" + raw).hexdigest()


def test_tensor_bytes_reach_blake3_without_a_copy():
    t = torch.zeros(4, dtype=torch.float32)
    _, raw = TensorCodec().chunks(t)
    assert isinstance(raw, memoryview) and raw.nbytes == 16
    t[0] = 1.0  # the view sees the tensor's own memory
    assert bytes(raw[:4]) == struct.pack("<f", 1.0)
    a = np.zeros(3, dtype=np.int16)
    _, raw_a = NdarrayCodec().chunks(a)
    a[1] = 7
    assert bytes(raw_a) == a.tobytes()


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


# -- refusals ---------------------------------------------------------------------------


def test_tensor_that_requires_grad_is_refused_as_data():
    t = torch.ones(2, requires_grad=True)
    with pytest.raises(
        ValueConversionError,
        match=r"wrap it in Opaque.*or detach it.*a detached output trains nothing.*freeze",
    ):
        encode({"x": [t]}, CODECS, "the output of node 'enc'")
    with pytest.raises(ValueConversionError, match=r"the output of node 'enc' at \['x'\]\[0\]"):
        digest({"x": [t]}, CODECS, "the output of node 'enc'")
    assert key(t.detach()) == key(torch.ones(2))  # detached, it is data


def test_graph_input_that_requires_grad_is_refused_when_passed_as_data():
    from somatize.torch import module

    class Id(Node):
        def forward(self, x, ctx):
            return Done(x)

    g = Graph.somatize(Id())
    module(g)  # equips the graph with the torch codecs
    with pytest.raises(ValueConversionError, match=r"the graph input.*Opaque"):
        g.forward(torch.ones(2, requires_grad=True))
    assert torch.equal(g.forward(torch.ones(2)), torch.ones(2))


def test_sparse_and_meta_tensors_and_object_arrays_are_refused():
    with pytest.raises(ValueConversionError, match="to_dense"):
        key(torch.eye(2).to_sparse())
    with pytest.raises(ValueConversionError, match="meta"):
        key(torch.empty(2, device="meta"))
    with pytest.raises(ValueConversionError, match="objects"):
        key(np.array([{}, 1], dtype=object))


def test_tensors_are_not_data_without_the_codecs():
    with pytest.raises(ValueConversionError, match=r"somatize\.torch"):
        digest(torch.ones(1))


def test_decode_refuses_a_payload_naming_no_dtype():
    c = TensorCodec()
    header = encode(("load", (1,)))
    with pytest.raises(ValueError, match="not a torch dtype"):
        c.decode(struct.pack(">Q", len(header)) + header + b"\0")


# -- the digest memo --------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=False),
        lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True),
        lambda ps: torch.optim.Adam(ps, lr=0.1),
    ],
    ids=["sgd", "sgd-foreach", "adam"],
)
def test_module_digest_is_memoised_until_an_optimizer_step(make_opt):
    c = TensorCodec()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()  # 4 parameters, 3 buffers
    first = c.fingerprint(net)
    assert c.hashed == 7
    assert c.fingerprint(net) == first
    assert c.hashed == 7  # unchanged: served from the version memo
    opt = make_opt(net[0].parameters())
    net(torch.randn(4, 3)).pow(2).sum().backward()
    opt.step()
    after = c.fingerprint(net)
    assert after != first
    assert c.hashed == 9  # the linear's weight and bias, nothing else
    assert c.fingerprint(net) == after and c.hashed == 9


def test_batch_norm_statistics_updated_in_training_mode_change_the_digest():
    """Batch norm writes its running statistics without moving their version counter."""
    c = TensorCodec()
    net = nn.BatchNorm1d(3)
    mean = net.running_mean
    version = mean._version
    first = c.fingerprint(net)
    net(torch.randn(5, 3) + 3.0)
    assert mean._version == version and not torch.equal(mean, torch.zeros(3))  # the trap
    assert c.fingerprint(net) != first


def test_module_digest_covers_training_mode_and_structure():
    c = TensorCodec()
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))
    train = c.fingerprint(net)
    assert c.fingerprint(net.eval()) != train
    assert c.fingerprint(nn.Sequential(net[0], nn.Identity()).eval()) != c.fingerprint(net)


def test_a_module_fingerprint_served_from_its_memo_follows_every_change():
    """The memo returns a module's last fingerprint only when all it was made of is equal;
    each change below must give the fingerprint a fresh computation would."""

    class Stateful(nn.Linear):
        def __init__(self) -> None:
            super().__init__(2, 2)
            self.note = 0

        def get_extra_state(self) -> int:
            return self.note

        def set_extra_state(self, state: int) -> None:
            self.note = state

    def fresh(net: nn.Module) -> str | None:
        return TensorCodec().fingerprint(net)

    c = TensorCodec()
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).eval()
    seen = {c.fingerprint(net)}
    assert c.fingerprint(net) == fresh(net)

    def changed() -> None:
        fp = c.fingerprint(net)
        assert fp == fresh(net) and fp not in seen
        seen.add(fp)

    with torch.no_grad():
        net[0].weight.add_(1.0)  # in place: the version counter moves
    changed()
    net[0].bias = nn.Parameter(torch.zeros(2))  # replaced
    changed()
    net[1] = nn.BatchNorm1d(2, eps=0.5)  # another submodule (its buffers are new tensors)
    with torch.no_grad():
        net[1].running_var.fill_(3.0)
    changed()
    net.train()
    changed()
    net.append(nn.Identity())  # structure
    changed()
    extra = nn.Sequential(Stateful()).eval()
    before = c.fingerprint(extra)
    extra[0].note = 1  # no tensor moves: a module with extra state is never memoised
    assert c.fingerprint(extra) != before and c.fingerprint(extra) == fresh(extra)


def test_memo_forgets_dead_tensors_and_never_confuses_a_new_one():
    c = TensorCodec()
    digests = set()
    for i in range(50):
        t = torch.full((2,), float(i))  # ids are reused as tensors die
        digests.add(c.digest(t))
    assert len(digests) == 50 and c.hashed == 50


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


def test_the_fingerprint_walks_modules_as_named_modules_does() -> None:
    """Its own walk: the same names, in the same order, a shared module named where it is
    first reached, None children skipped, cycles-free nesting at any depth."""
    shared = nn.Linear(2, 2)
    inner = nn.Sequential(shared, nn.ReLU(), nn.Sequential(nn.Tanh(), shared))
    root = nn.ModuleDict({"b": inner, "a": shared, "c": nn.ModuleList([inner, nn.Identity()])})
    root.register_module("gone", None)
    deep: nn.Module = nn.Identity()
    for _ in range(30):
        deep = nn.Sequential(deep, nn.ReLU())
    for m in (root, inner, shared, deep, nn.TransformerEncoderLayer(8, 2, 16)):
        assert _named_modules(m) == list(m.named_modules())


def test_a_module_fingerprint_from_its_memos_equals_one_made_afresh() -> None:
    """The memo path (unchanged weights and settings read back, no hashing) gives what a
    new codec, hashing everything, gives — after each kind of change, too."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.LeakyReLU(0.1)).eval()

    def step_weights() -> None:
        with torch.no_grad():
            net[0].weight.add_(1.0)

    changes = [
        lambda: None,
        step_weights,
        lambda: setattr(net[2], "negative_slope", 0.3),
        lambda: net.train(),
        lambda: net[1].running_mean.add_(1.0),  # in training mode: buffers hashed each time
        lambda: net.eval(),
        lambda: setattr(net[0], "bias", nn.Parameter(torch.zeros(4))),
    ]
    warm, seen = TensorCodec(), []
    for change in changes:
        change()
        got = warm.fingerprint(net)
        assert got == TensorCodec().fingerprint(net)
        seen.append(got)
    assert len(set(seen)) == len(seen)  # every change is seen
    hashed = warm.hashed
    assert warm.fingerprint(net) == seen[-1] and warm.hashed == hashed  # read from the memos
