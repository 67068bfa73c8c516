"""The key of a lone tensor (``somatize/torch/tensor_keys.py``): keyed blake3 of its bytes
under a key of its dtype and shape, the same by the data-pointer road as by the slow road,
for every tensor that takes the pointer road and every one that must not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from blake3 import blake3
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, ValueConversionError, digest, encode
from somatize.torch import NdarrayCodec, TensorCodec
from somatize.torch.tensor_keys import _SMALL

CODECS = (TensorCodec(), NdarrayCodec())


def encoded_key(t: torch.Tensor) -> str:
    """Keyed blake3 of the raw bytes written out by hand (what every road must give)."""
    raw = t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
    layout = encode(("somatize.tensor/2", str(t.dtype).removeprefix("torch."), tuple(t.shape)))
    return blake3(raw.numpy().tobytes(), key=blake3(layout).digest()).hexdigest()


def twice(t: torch.Tensor) -> tuple[str, str]:
    """The key of ``t`` the first time its (dtype, shape) is seen and once it is known."""
    _SMALL.pop((t.dtype, tuple(t.shape)), None)
    return digest(t, CODECS), digest(t, CODECS)


SMALL = {
    "float32 item": torch.randn(256),
    "float64": torch.randn(3, 5, dtype=torch.float64),
    "float16": torch.randn(7, dtype=torch.float16),
    "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
    "int64": torch.tensor([2**62, -(2**62)]),
    "bool": torch.tensor([[True, False], [False, True]]),
    "0-d": torch.tensor(3.5),
    "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
    "64 KiB": torch.randn(16384),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_pointer_road_gives_the_key_of_the_slow_road(name):
    t = SMALL[name]
    first, known = twice(t)
    assert first == known == encoded_key(t)
    assert first != blake3(encode(t, CODECS)).hexdigest()  # (the scheme before: not mixed)
    assert (t.dtype, tuple(t.shape)) in _SMALL  # the second key took the pointer road


def test_a_contiguous_slice_is_read_from_its_own_offset():
    base = torch.arange(40, dtype=torch.float32)
    digest(base[:8], CODECS)  # (float32, (8,)) known
    for start in (0, 3, 32):
        view = base[start : start + 8]
        assert digest(view, CODECS) == encoded_key(view) == digest(view.clone(), CODECS)


def test_tensors_the_pointer_road_must_not_read_take_the_general_path():
    """Each of these shares its (dtype, shape) with a known plain tensor, so only the
    checks keep it off the pointer road; each gets the key of its content."""
    base = torch.randn(4, 6)
    digest(torch.randn(6, 4), CODECS)
    digest(torch.randn(4), CODECS)
    transposed = base.T  # (6, 4), not contiguous
    assert digest(transposed, CODECS) == encoded_key(transposed)
    neg = torch._neg_view(torch.randn(4))  # a real tensor with the neg bit
    assert neg.is_neg()
    assert digest(neg, CODECS) == encoded_key(neg) == digest(neg.resolve_neg(), CODECS)
    imag = torch.complex(torch.randn(4), torch.randn(4)).conj().imag  # neg bit, by conj
    assert digest(imag, CODECS) == encoded_key(imag)
    conj = torch.complex(torch.randn(4), torch.randn(4))
    digest(conj, CODECS)
    assert digest(conj.conj(), CODECS) == encoded_key(conj.conj()) != digest(conj, CODECS)
    assert (torch.complex64, (4,)) not in _SMALL  # complex: never by pointer (conj bit)
    param = nn.Parameter(torch.randn(4), requires_grad=False)  # a subclass: the slow road
    assert digest(param, CODECS) == encoded_key(param.detach())
    zero = torch._efficientzerotensor(4)  # no memory: data_ptr() is 0
    assert CODECS[0].key(zero) is None


def test_a_tensor_that_requires_grad_is_refused_though_its_shape_is_known():
    digest(torch.randn(5), CODECS)
    assert CODECS[0].key(torch.randn(5, requires_grad=True)) is None
    with pytest.raises(ValueConversionError, match="requires grad"):
        digest(torch.randn(5, requires_grad=True), CODECS)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_a_tensor_of_another_layout_is_refused_though_its_dtype_and_shape_are_known():
    """The pointer road does not read the layout: a sparse or mkldnn tensor has no data
    pointer (``data_ptr()`` raises), so it is left to the general path, which refuses it."""
    dense = torch.randn(4, 4)
    digest(dense, CODECS)  # (float32, (4, 4)) known
    others = [dense.to_sparse(), dense.to_sparse_csr()]
    if torch.backends.mkldnn.is_available():
        others.append(dense.to_mkldnn())
    for other in others:
        assert (other.dtype, tuple(other.shape)) in _SMALL
        assert CODECS[0].key(other) is None
        with pytest.raises(ValueConversionError, match="dense"):
            digest(other, CODECS)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_a_nested_tensor_is_refused_with_the_fix_that_pads_it(layout):
    """A strided nested tensor has layout torch.strided but no sizes: it passed as data and
    raised torch's 'Internal error ... Please file an issue' where a shape was read. Both
    layouts are told to pad (``to_dense()``, the fix given before, refuses both)."""
    nt = torch.nested.nested_tensor([torch.arange(3), torch.arange(2)], layout=layout)
    with pytest.raises(ValueConversionError, match=r"nested tensor.*2 sequences.*to_padded_t"):
        digest(nt, CODECS)
    assert torch.equal(nt.to_padded_tensor(0), torch.tensor([[0, 1, 2], [0, 1, 0]]))


def test_a_tensor_without_storage_is_left_to_the_general_path():
    digest(torch.randn(3), CODECS)
    seen = []

    def inner(x):
        seen.append(CODECS[0].key(x))  # a functorch batched tensor: data_ptr() raises
        return x

    torch.vmap(inner)(torch.randn(2, 3))
    assert seen == [None]


def test_dtype_shape_and_bytes_all_enter_the_key():
    raw = torch.arange(4, dtype=torch.int32)
    same_bytes = [
        raw,
        raw.view(torch.float32),
        raw.view(torch.uint8).view(torch.int32).reshape(2, 2),
        raw.view(torch.int16),  # (8,)
        raw.view(torch.int16).reshape(2, 4),
    ]
    for t in same_bytes:
        digest(t, CODECS)  # each pair known: the keys below take the pointer road
    keys = [digest(t, CODECS) for t in same_bytes]
    assert len(set(keys)) == len(keys)
    other = raw.clone()
    other[3] = 4
    assert digest(other, CODECS) != keys[0]


def test_same_bytes_of_another_dtype_or_shape_get_another_key_by_every_road():
    """Every (bytes, dtype, shape) triple gets its own key, whether or not its layout is
    known, and whether it is read by pointer, through a view, or from a copy."""
    raw = torch.arange(8, dtype=torch.int32)
    same_bytes = [
        raw,
        raw.view(torch.float32),
        raw.view(torch.uint32),
        raw.reshape(2, 4),
        raw.reshape(4, 2),
        raw.reshape(1, 8),
        raw.view(torch.int16),
        raw.view(torch.uint8),
        raw.view(torch.int64),
    ]
    for t in same_bytes:
        _SMALL.pop((t.dtype, tuple(t.shape)), None)
    first = [digest(t, CODECS) for t in same_bytes]  # the slow road
    known = [digest(t, CODECS) for t in same_bytes]  # the pointer road
    # the same contents in another memory order (not contiguous: the slow road), or copied
    views = [t.T.contiguous().T if t.dim() == 2 else t.clone() for t in same_bytes]
    assert not any(v.is_contiguous() for v in views if v.dim() == 2 and min(v.shape) > 1)
    assert first == known == [digest(v, CODECS) for v in views]
    assert len(set(first)) == len(first)


def test_the_key_is_pinned_and_the_same_in_a_fresh_process():
    """The key scheme (``somatize.tensor/2``) does not change unnoticed (cache entries keep
    their keys), and it does not depend on the process."""
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    pinned = "997c459c0fa2bf13baefa2c118e4bcb05e82b839d7f3fabd4732756e163c2fd1"
    assert twice(t) == (pinned, pinned)
    code = (
        "import torch; from somatize import digest; from somatize.torch.codecs import "
        "default_codecs; c = default_codecs(); t = torch.arange(6, dtype=torch.float32).reshape(2, 3);"
        "print(digest(t, c), digest(t, c))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [pinned, pinned]


def test_a_tensor_off_the_cpu_is_not_read_through_its_pointer():
    digest(torch.randn(6), CODECS)
    assert CODECS[0].key(torch.empty(6, device="meta")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_tensor_of_a_known_dtype_and_shape_is_keyed_by_its_bytes_not_its_pointer():
    digest(torch.randn(6), CODECS)  # (float32, (6,)) known on the CPU
    on_gpu = torch.randn(6, device="cuda")  # a device pointer read as host memory would crash
    assert digest(on_gpu, CODECS) == digest(on_gpu.cpu(), CODECS) == encoded_key(on_gpu.cpu())


class Tagged(torch.Tensor):
    """A tensor subclass: same bytes as a plain tensor, another type (as torchvision's
    ``tv_tensors.BoundingBoxes`` carries a format and a canvas size beside its values)."""


class ByType(Node):
    """Answers by its input's type, as transforms dispatching on tv_tensors do."""

    rowwise = True

    def forward(self, x, ctx):
        return Done(x.as_subclass(torch.Tensor) * (5.0 if isinstance(x, Tagged) else 1.0))


def test_a_tensor_subclass_is_not_data_its_type_would_enter_no_key():
    plain = torch.ones(2, 3)
    with pytest.raises(ValueConversionError, match=r"torch\.Tensor subclass Tagged.*as_subclass"):
        digest(plain.as_subclass(Tagged), CODECS)
    assert digest(nn.Parameter(plain, requires_grad=False), CODECS) == digest(plain, CODECS)


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_cached_node_given_a_tensor_subclass_says_so_and_serves_no_plain_rows(per):
    g = Graph.somatize(ByType().with_id("enc"))
    g.cache("enc", per=per)
    st.module(g)
    plain = torch.ones(2, 3)
    assert torch.equal(g.forward(plain), plain)
    with pytest.raises(ValueConversionError, match=r"torch\.Tensor subclass Tagged") as e:
        g.forward(plain.clone().as_subclass(Tagged))
    if per == "example":  # (before: the error named no node)
        assert str(e.value).startswith("node 'enc' is cached per example, but its input holds")


class OwnNoise(Node):
    """Draws from a generator of its own (seeded: reproducible, but fresh at every call)."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def forward(self, x, ctx):
        return Done(x + torch.randn(x.shape, generator=self.gen))


def test_a_generator_a_node_holds_enters_its_state_by_where_it_stands():
    """Its draws are fresh at every call, as in plain PyTorch, and a node seeded alike
    elsewhere hits the entries of the same draws."""
    keeper, x = MemoryKeeper(), torch.zeros(2, 3)
    g = Graph(keeper=keeper).node("n", OwnNoise(0)).cache("n")
    st.module(g)
    with pytest.warns(UserWarning, match=r"node 'n' \(OwnNoise\) is cached but changed"):
        first = g.forward(x)
    assert not torch.equal(g.forward(x), first)  # the generator moved on: a new draw
    again = Graph(keeper=keeper).node("n", OwnNoise(0)).cache("n")
    st.module(again)
    assert torch.equal(again.forward(x), first)  # the same seed, the same state: a hit


def test_a_cached_node_given_a_torch_size_is_keyed_by_it():
    """Found by a review: ``Resize(x.shape[1:])`` raised DeclarationError once cached."""

    class Resize(Node):
        def __init__(self, shape: torch.Size) -> None:
            self.shape = shape

        def forward(self, x, ctx):
            return Done(x.reshape(-1, *self.shape))

    x = torch.arange(12.0).reshape(2, 6)
    keeper = MemoryKeeper()
    for shape, want in ((torch.Size([2, 3]), (2, 2, 3)), (torch.Size([3, 2]), (2, 3, 2))):
        g = Graph.somatize(Resize(shape), keeper=keeper).cache("resize")
        st.module(g)  # (the tensor codec)
        assert g.forward(x).shape == want and g.forward(x).shape == want
    assert keeper.stats().entries == 2  # one entry per shape: the size is in the key
