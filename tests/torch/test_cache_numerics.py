"""torch's numeric settings a node's output depends on enter its key where they are not
torch's defaults: the default dtype (what ``torch.arange(3.0)`` makes) and the float32
matmul precision (TF32 or bfloat16 passes). Keys made under the defaults do not change."""

from __future__ import annotations

import contextlib

import pytest
import torch

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node

X = torch.ones(4, 2)


class Ramp(Node):
    rowwise = True

    def forward(self, x, ctx):
        return Done(torch.arange(3.0) * x.sum(dim=1, keepdim=True).to(torch.get_default_dtype()))


@contextlib.contextmanager
def setting(get, put, value):
    """torch's global setting ``put(value)`` for the block, then as it was."""
    before = get()
    put(value)
    try:
        yield
    finally:
        put(before)


def default_dtype(dtype):
    return setting(torch.get_default_dtype, torch.set_default_dtype, dtype)


def matmul(precision):
    return setting(
        torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, precision
    )


def cached(per: str) -> Graph:
    g = Graph(keeper=MemoryKeeper()).node("r", Ramp()).cache("r", per=per)
    st.module(g)
    return g


@pytest.mark.parametrize("per", ["example", "batch"])
def test_the_default_dtype_enters_the_key(per):
    # a float32 output was served after torch.set_default_dtype(torch.float64)
    g = cached(per)
    assert g.forward(X).dtype == torch.float32
    with default_dtype(torch.float64):
        wide = g.forward(X)
        assert wide.dtype == torch.float64
        assert g.explain(X)["r"].changed == ()  # (found: stored under this context)
    assert g.forward(X).dtype == torch.float32  # the first entry again


def test_explain_names_the_default_dtype_and_the_matmul_precision():
    g = cached("batch")
    g.forward(X)
    with default_dtype(torch.float64), matmul("high"):
        assert g.explain(X)["r"].changed == (
            "context (default dtype torch.float64, float32 matmul high, was off)",
        )


def test_keys_under_torchs_defaults_carry_no_context():
    codec = st.TensorCodec()
    assert codec.context() is None
    with matmul("medium"):
        assert codec.context() == (("float32 matmul", "medium"),)
    with torch.autocast("cpu", dtype=torch.bfloat16), default_dtype(torch.float64):
        assert codec.context() == (("cpu", "torch.bfloat16"), ("default dtype", "torch.float64"))


# torch >= 2.9's per-backend precision (torch.backends.cuda.matmul.fp32_precision), which
# PyTorch now recommends; once it is used, torch.get_float32_matmul_precision() raises
_fp32 = getattr(torch._C, "_get_fp32_precision_getter", None)
_BACKENDS = [("generic", "all"), ("cuda", "all"), ("mkldnn", "all")] + [
    (b, op) for b in ("cuda", "mkldnn") for op in ("matmul", "conv", "rnn")
]
new_api = pytest.mark.skipif(_fp32 is None, reason="torch < 2.9 has no fp32_precision")


@contextlib.contextmanager
def fp32_precision(set_it):
    """``set_it()`` (new-API settings) for the block, then every backend as it was."""
    before = [(b, op, _fp32(b, op)) for b, op in _BACKENDS]
    legacy = torch.get_float32_matmul_precision()
    set_it()
    try:
        yield
    finally:
        for b, op, value in before:  # (generic first: a backend's setting goes down to its ops)
            torch._C._set_fp32_precision_setter(b, op, value)
        assert [(b, op, _fp32(b, op)) for b, op in _BACKENDS] == before
        assert torch.get_float32_matmul_precision() == legacy  # (not left mixed)


def _cuda_tf32():
    torch.backends.cuda.matmul.fp32_precision = "tf32"


def _all_tf32():
    torch.backends.cuda.matmul.fp32_precision = "none"  # (set by an op's own: it would win)
    torch.backends.mkldnn.matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"


def _cpu_bf16():
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"


@new_api
@pytest.mark.parametrize(
    ("set_it", "said"),
    [
        (_cuda_tf32, "cuda tf32, cpu ieee"),
        (_all_tf32, "high"),  # (CUDA and CPU TF32: what set_float32_matmul_precision names so)
        (_cpu_bf16, "cuda ieee, cpu bf16"),
    ],
    ids=["cuda.matmul", "backends", "mkldnn.matmul"],
)
@pytest.mark.parametrize("per", ["example", "batch"])
def test_the_per_backend_precision_enters_the_key_and_keys_still(per, set_it, said):
    # every cached forward raised torch's RuntimeError about mixing the legacy and new APIs
    g = cached(per)
    g.forward(X)
    with fp32_precision(set_it):
        assert st.TensorCodec().context() == (("float32 matmul", said),)
        assert g.explain(X)["r"].changed == (f"context (float32 matmul {said}, was off)",)
        g.forward(X)
        assert g.explain(X)["r"].changed == ()  # stored under this context
    assert g.explain(X)["r"].changed == ()  # the first entry again, under the defaults


@new_api
def test_the_per_backend_precision_set_back_to_full_float32_is_torchs_default():
    codec = st.TensorCodec()

    def ieee():
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.mkldnn.matmul.fp32_precision = "ieee"

    with fp32_precision(ieee):
        assert codec.context() is None
