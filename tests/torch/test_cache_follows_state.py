"""A cached node's key follows everything its output depends on: a hit always equals
recomputing. Each test changes one thing a frozen, cached node's output depends on and
checks the cached result against the node run afresh (found by an outside audit)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque


class Enc(Node):
    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(0.1))

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


def cached(node: Node, per: str = "example") -> Graph:
    g = Graph(keeper=MemoryKeeper()).node("enc", node)
    g.freeze("enc").cache("enc", per=per)
    st.module(g)
    return g


def fresh(node: Node, x: torch.Tensor) -> Any:
    with torch.no_grad():
        return node.forward(x, None).value.value


X = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)) - 1


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_write_that_moves_no_version_counter_is_seen_after_module(per):
    node = Enc()
    g = cached(node, per)
    g.forward(X)
    node.net[0].weight.data.mul_(2)  # .data: the version counter does not move
    st.module(g)  # (as every fit does)
    assert torch.equal(g.forward(X), fresh(node, X))


def test_a_fused_optimizer_step_between_fits_is_seen():
    node = Enc()
    g = cached(node)
    g.forward(X)
    opt = torch.optim.Adam(node.net.parameters(), lr=0.1, fused=True)
    node.net[0].weight.grad = torch.ones_like(node.net[0].weight)
    opt.step()  # fused kernels write the weights without moving their version counters
    st.module(g)
    assert torch.equal(g.forward(X), fresh(node, X))


@pytest.mark.parametrize("per", ["example", "batch"])
def test_autocast_enters_the_key(per):
    node = Enc()
    g = cached(node, per)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = g.forward(X)
        assert low.dtype == torch.bfloat16
    full = g.forward(X)  # not the bf16 rows
    assert full.dtype == torch.float32 and torch.equal(full, fresh(node, X))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again = g.forward(X)  # the bf16 rows are found again
        assert again.dtype == torch.bfloat16 and torch.equal(again, low)
