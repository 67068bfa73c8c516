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
