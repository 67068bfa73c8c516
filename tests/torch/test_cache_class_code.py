"""What a node's or a module's class holds is in the key (found by an outside audit): a
tensor class attribute of a node class (``MEAN = torch.tensor(...)``, rebound or written in
place), the class attributes of the user's own ``nn.Module`` classes, and a method of such
a module class patched or its code replaced in place (``%autoreload 2``). Each test runs
the cached node, changes the class, and checks the cached result against the node run
afresh — in the running graph and in a new graph sharing its keeper."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import somatize.torch as st
import somatize.torch.fingerprints as fingerprints
from somatize import Done, Graph, MemoryKeeper, Node, Opaque

X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


class Centred(Node):
    MEAN = torch.zeros(4)  # normalisation stats, as if loaded at import

    def forward(self, x, ctx):
        return Done(x - self.MEAN)


class Block(nn.Module):
    K = 2.0
    T = torch.tensor(3.0)

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.K * self.T


class Holds(Node):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.b = Block()

    def forward(self, x, ctx):
        return Done(Opaque(self.b(x)))


def cached(node: Node, keeper: Any, per: str = "example") -> nn.Module:
    g = Graph.somatize(node.with_id("enc"), keeper=keeper)
    return st.module(g.freeze("enc").cache("enc", per=per))


def fresh(node: Node) -> torch.Tensor:
    with torch.no_grad():
        out = node.forward(X, None).value
    return out.value if isinstance(out, Opaque) else out


def agrees(node: Node, keeper: Any, g: nn.Module, per: str) -> bool:
    want = fresh(node)
    return torch.equal(g(X), want) and torch.equal(cached(node, keeper, per)(X), want)


def test_a_tensor_class_attribute_of_a_node_class_written_or_rebound_is_a_new_key():
    for per in ("example", "batch"):
        node, keeper = Centred(), MemoryKeeper()
        g = cached(node, keeper, per)
        g(X)
        try:
            Centred.MEAN.add_(1)  # written in place
            assert agrees(node, keeper, g, per)
            Centred.MEAN = torch.full((4,), 5.0)  # rebound
            assert agrees(node, keeper, g, per)
        finally:
            Centred.MEAN = torch.zeros(4)


def test_a_class_attribute_of_a_user_module_class_is_a_new_key():
    for per in ("example", "batch"):
        node, keeper = Holds(), MemoryKeeper()
        g = cached(node, keeper, per)
        g(X)
        try:
            Block.K = 5.0
            assert agrees(node, keeper, g, per)
            Block.T.mul_(3)  # a tensor class attribute written in place
            assert agrees(node, keeper, g, per)
        finally:
            Block.K, Block.T = 2.0, torch.tensor(3.0)


def test_a_user_module_class_whose_method_is_patched_or_code_replaced_is_a_new_key():
    def times_100(self, x):
        return self.lin(x) * 100

    def times_9(self, x):
        return self.lin(x) * 9

    before = Block.forward
    for per in ("example", "batch"):
        node, keeper = Holds(), MemoryKeeper()
        g = cached(node, keeper, per)
        g(X)
        try:
            Block.forward = times_100
            assert agrees(node, keeper, g, per)
            times_100.__code__ = times_9.__code__  # its code replaced in place
            assert agrees(node, keeper, g, per)
        finally:
            Block.forward = before


def test_a_user_module_class_code_is_read_once_while_it_stays(monkeypatch):
    calls = []
    real = fingerprints.fingerprint_code
    monkeypatch.setattr(
        fingerprints, "fingerprint_code", lambda cls: calls.append(cls) or real(cls)
    )

    class Fresh(nn.Module):
        def forward(self, x):
            return x + 1

    class Uses(Node):
        def __init__(self) -> None:
            self.m = Fresh()

        def forward(self, x, ctx):
            return Done(self.m(x))

    g = cached(Uses(), MemoryKeeper(), "batch")
    for i in range(10):
        assert torch.equal(g(X + i), X + i + 1)
    assert calls.count(Fresh) == 1
