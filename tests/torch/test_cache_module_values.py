"""Values a module holds that are neither tensors nor Python numbers — numpy arrays and
scalars (``np.sqrt(d)`` is an ``np.float64``), ``Fraction``, ``Decimal``, ``complex`` —
enter its fingerprint by value, read with the graph's codecs (found by an outside audit:
they entered as None, so a sweep of backbones differing only in such a value shared
rows). An object nothing of which can be read warns, naming the module's class."""

from __future__ import annotations

import collections
import decimal
import fractions
import pickle
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque

X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


class Scaled(nn.Module):
    """A user module keeping a value of any kind, read in forward as a float or array."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.value
        if isinstance(v, list):
            v = v[0]
        if isinstance(v, np.ndarray):
            return self.lin(x - torch.from_numpy(v))
        return self.lin(x) * float(v.real if isinstance(v, complex) else v)


class Enc(Node):
    def __init__(self, net: nn.Module) -> None:
        self.net = net

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.net(x)))


def cached(node: Node, per: str, keeper: Any = None) -> Graph:
    g = Graph(keeper=keeper or MemoryKeeper()).node("enc", node).freeze("enc")
    g.cache("enc", per=per)
    st.module(g)
    return g


def fresh(node: Enc) -> torch.Tensor:
    with torch.no_grad():
        return node.net(X)


VALUES = [
    ("ndarray", np.zeros(4, np.float32), np.full(4, 7.0, np.float32)),
    ("np.float64", np.sqrt(16.0), np.sqrt(64.0)),
    ("np.float32", np.float32(2.0), np.float32(5.0)),
    ("np.int64", np.int64(2), np.int64(5)),
    ("list of arrays", [np.ones(4, np.float32)], [np.full(4, 3.0, np.float32)]),
    ("Fraction", fractions.Fraction(1, 2), fractions.Fraction(1, 3)),
    ("Decimal", decimal.Decimal("0.5"), decimal.Decimal("0.25")),
    ("complex", 1 + 0j, 2 + 0j),
]


@pytest.mark.parametrize("per", ["example", "batch"])
@pytest.mark.parametrize(("one", "other"), [v[1:] for v in VALUES], ids=[v[0] for v in VALUES])
def test_a_value_a_module_holds_enters_the_key(per, one, other):
    node = Enc(Scaled(one))
    g = cached(node, per)
    g.forward(X)
    node.net.value = other  # replaced on the running graph
    assert torch.equal(g.forward(X), fresh(node))
    torch.manual_seed(0)
    a = Enc(Scaled(one))
    torch.manual_seed(0)
    b = Enc(Scaled(other))  # the same weights, another value: a sweep sharing a keeper
    keeper = MemoryKeeper()
    cached(a, per, keeper).forward(X)
    assert torch.equal(cached(b, per, keeper).forward(X), fresh(b))


@pytest.mark.parametrize("per", ["example", "batch"])
def test_an_array_a_module_holds_written_in_place_is_seen(per):
    node = Enc(Scaled(np.zeros(4, np.float32)))
    g = cached(node, per)
    g.forward(X)
    node.net.value[:] = 5.0
    assert torch.equal(g.forward(X), fresh(node))


def test_a_number_of_another_type_is_another_setting_and_one_value_one_fingerprint():
    """0.5, np.float64(0.5) and np.float32(0.5) compute differently (``np.float64(0.5) * t``
    is an ndarray; float32 rounds): apart, as 1 and 1.0 are; equal values of one type in
    two modules (and two processes' codecs) are one setting."""
    torch.manual_seed(0)
    nets = [Scaled(v) for v in (0.5, np.float64(0.5), np.float32(0.5))]
    for n in nets[1:]:
        n.load_state_dict(nets[0].state_dict())
    prints = [st.TensorCodec().fingerprint(n) for n in nets]
    assert len(set(prints)) == 3
    twin = Scaled(np.float64(0.5))
    twin.load_state_dict(nets[0].state_dict())
    assert st.TensorCodec().fingerprint(twin) == prints[1]


def test_an_immutable_value_is_read_once_while_it_is_the_same_object():
    """A frozen backbone's fingerprint is asked every batch: a numpy float is as
    immutable as a float, so it is not hashed again while the module holds the same one."""
    codec = st.TensorCodec()
    net = Scaled(np.float64(0.5))
    first = codec.fingerprint(net)
    numpy_codec = codec._held_codes().codecs[1]
    hashed = numpy_codec.hashed
    assert codec.fingerprint(net) == first and numpy_codec.hashed == hashed
    net.value = np.float64(0.25)
    assert codec.fingerprint(net) != first and numpy_codec.hashed == hashed + 1


def test_module_values_are_read_with_the_graphs_codecs():
    node = Enc(Scaled(np.float64(0.5)))
    g = cached(node, "batch")
    (tensors,) = [c for c in g.codecs if isinstance(c, st.TensorCodec)]
    assert set(map(id, tensors._held_codes().codecs)) == set(map(id, g.codecs))


class Queued(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen = collections.deque(maxlen=2)  # nothing of it can be read


def test_an_object_nothing_of_which_can_be_read_warns_naming_the_module():
    with pytest.warns(UserWarning, match=r"module class '.*Queued' holds a collections.deque"):
        st.TensorCodec().fingerprint(Queued())


def test_a_codec_that_read_what_modules_hold_still_pickles():
    codec = st.TensorCodec()
    codec.fingerprint(Scaled([np.ones(4, np.float32)]))
    again = pickle.loads(pickle.dumps(codec))
    assert again.fingerprint(Scaled(np.float64(1.0))) is not None


class Shifted(nn.Module):
    """A user module class holding an array and numpy and Fraction scalars."""

    SHIFT = np.zeros(4, dtype=np.float32)
    GAIN = np.float64(2.0)
    PART = fractions.Fraction(1, 2)

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x - torch.from_numpy(self.SHIFT)) * float(self.GAIN)
        return out * float(self.PART)


def test_an_array_or_value_a_user_module_class_holds_is_a_new_key() -> None:
    # a module class's data is read with the graph's codecs (numpy's among them), and an
    # immutable value no codec reads by its value
    for per in ("example", "batch"):
        torch.manual_seed(0)
        node = Enc(Shifted())
        g = cached(node, per)
        assert torch.equal(g.forward(X), fresh(node))
        try:
            Shifted.SHIFT += 1  # written in place
            assert torch.equal(g.forward(X), fresh(node))
            Shifted.GAIN = np.float64(3.0)
            assert torch.equal(g.forward(X), fresh(node))
            Shifted.PART = fractions.Fraction(1, 3)
            assert torch.equal(g.forward(X), fresh(node))
        finally:
            Shifted.SHIFT = np.zeros(4, dtype=np.float32)
            Shifted.GAIN, Shifted.PART = np.float64(2.0), fractions.Fraction(1, 2)
