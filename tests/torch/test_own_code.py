"""``module(g)``'s forward runs from a copy of its code, bound weakly: the module is freed by
its last reference, not by the cyclic collector (``somatize/torch/own_code.py``)."""

from __future__ import annotations

import contextlib
import gc
import inspect
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


@contextlib.contextmanager
def no_collector() -> Iterator[None]:
    """The cyclic collector off: what dies here dies by reference counting alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_dropped_module_is_freed_without_the_cyclic_collector():
    g = Graph.somatize(Linear())
    with no_collector():
        m = st.module(g)
        m(torch.randn(3, 4))
        gone = weakref.ref(m)
        del m
        assert gone() is None  # before: module -> its bound forward -> module, a cycle
    assert st.module(g) is not None  # made again, as after any drop


def test_each_module_runs_its_own_code_and_reads_as_before():
    a, b = st.module(Graph.somatize(Linear())), st.module(Graph.somatize(Linear()))
    assert a.forward.__code__ is not b.forward.__code__  # (per graph: dynamo's limit each)
    assert list(inspect.signature(a.forward).parameters) == ["args"]  # (self bound, as before)
    x = torch.randn(3, 4)
    torch.testing.assert_close(a(x), a.graph["linear"].lin(x))
    torch.testing.assert_close(a.forward(x), a(x))


def test_a_forward_kept_past_its_module_says_so():
    fwd = st.module(Graph.somatize(Linear())).forward  # the module itself is not kept
    with pytest.raises(ReferenceError, match="keep the model"):
        fwd(torch.randn(3, 4))
