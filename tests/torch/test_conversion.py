"""Converting a graph's module (``.to(torch.float64)``, ``.double()``, ``.to(device, dtype)``)
with a frozen, cached node: with ``torch.utils.swap_tensors`` (``torch.__future__
.set_swap_module_params_on_conversion(True)``) and without, against the same network
converted in plain PyTorch; frozen nodes stay frozen, cached ones are keyed anew."""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import somatize.torch as st
from recipes.frozen_backbone import Backbone, Head
from somatize import Graph, MemoryKeeper
from somatize.torch.freezers import MARK
from somatize.watchers import CacheHit, CacheMiss, CacheRows, Recorder

CONVERSIONS: dict[str, Callable[[nn.Module], object]] = {
    "to-dtype": lambda m: m.to(torch.float64),
    "double": lambda m: m.double(),
    "to-device-dtype": lambda m: m.to("cpu", torch.float64),
}
CACHING = ["per-example", "whole", "none"]


@pytest.fixture(params=[True, False], ids=["swap", "in-place"])
def swap(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Conversions by ``torch.utils.swap_tensors``, or torch's default (``param.data =``)."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(request.param)
    yield request.param
    torch.__future__.set_swap_module_params_on_conversion(before)


def graph(caching: str, rec: Recorder | None = None) -> Graph:
    """The recipe's CNN backbone, frozen, before a trainable head."""
    torch.manual_seed(0)
    g = Graph.somatize(
        Backbone(4).with_id("enc") >> Head(32),
        keeper=MemoryKeeper(),
        watchers=[rec] if rec is not None else [],
    )
    g.freeze("enc")
    if caching == "per-example":
        g.cache("enc", per="example")
    elif caching == "whole":
        g.cache("enc")
    return g


def reference(g: Graph) -> tuple[nn.Module, nn.Module]:
    """The same network in plain PyTorch: copies of the backbone (frozen) and the head."""
    backbone = copy.deepcopy(g["enc"].net).eval()
    for p in backbone.parameters():
        p.requires_grad_(False)
    return backbone, copy.deepcopy(g["head"].out)


def enc_parameters(g: Graph) -> list[nn.Parameter]:
    return list(g["enc"].net.parameters())


def computed(rec: Recorder) -> int:
    """Rows (per example) or calls (whole) the backbone computed, of what ``rec`` saw."""
    return sum(e.misses for e in rec.of(CacheRows)) + len(rec.of(CacheMiss))


def served(rec: Recorder) -> int:
    return sum(e.hits for e in rec.of(CacheRows)) + len(rec.of(CacheHit))


@pytest.mark.parametrize("caching", CACHING)
@pytest.mark.parametrize("convert", list(CONVERSIONS))
def test_a_converted_module_computes_and_trains_as_the_network_converted_in_torch(
    swap: bool, convert: str, caching: str
) -> None:
    g = graph(caching)
    m = st.module(g).train()
    x32 = torch.randn(6, 64)
    m(x32)  # (float32 rows remembered, digests memoised: what a conversion must not trip on)
    backbone, head = reference(g)
    params = dict(m.named_parameters())
    CONVERSIONS[convert](m)
    CONVERSIONS[convert](backbone)
    CONVERSIONS[convert](head)
    assert dict(m.named_parameters()) == params  # the same parameters, converted
    assert all(p.dtype == torch.float64 for p in m.parameters())

    x = x32.double()
    out = m(x)
    expected = head(backbone(x))
    assert out.dtype == torch.float64 and torch.equal(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    trained = g["head"].out
    assert torch.equal(trained.weight.grad, head.weight.grad)
    assert torch.equal(trained.bias.grad, head.bias.grad)

    # frozen stays frozen: no grads, not trainable, marked, even after a module-wide toggle
    assert all(p.grad is None and not p.requires_grad for p in enc_parameters(g))
    assert all(getattr(p, MARK, False) for p in enc_parameters(g))
    m.requires_grad_(True)
    assert {id(p) for p in st.parameters(g)} == {id(p) for p in trained.parameters()}


@pytest.mark.parametrize("caching", ["per-example", "whole"])
def test_a_cached_frozen_node_is_keyed_anew_after_a_conversion_never_served_float32(
    swap: bool, caching: str
) -> None:
    rec = Recorder()
    g = graph(caching, rec)
    m = st.module(g)
    x32 = torch.randn(5, 64)
    m(x32)
    m(x32)
    rows = 5 if caching == "per-example" else 1
    assert (computed(rec), served(rec)) == (rows, rows)  # (remembered in float32)
    backbone, head = reference(g)
    m.to(torch.float64)
    backbone.double()
    head.double()

    x = x32.double()
    first = m(x)
    assert computed(rec) == 2 * rows and served(rec) == rows  # new weights' dtype: new key
    again = m(x)
    assert computed(rec) == 2 * rows and served(rec) == 2 * rows  # float64 rows, served
    expected = head(backbone(x))
    assert first.dtype == again.dtype == torch.float64
    assert torch.equal(first, expected) and torch.equal(again, expected)


@pytest.mark.parametrize("convert", list(CONVERSIONS))
def test_a_frozen_node_unfrozen_after_a_conversion_trains(swap: bool, convert: str) -> None:
    """Unfreezing gives back what freezing took: the mark survives a swap, which drops a
    parameter's attributes."""
    g = graph("per-example")
    m = st.module(g)
    m(torch.randn(2, 64))
    CONVERSIONS[convert](m)
    g.freeze("enc", False)
    trainable = {id(p) for p in st.parameters(g)}
    assert all(p.requires_grad and id(p) in trainable for p in enc_parameters(g))
    assert not any(hasattr(p, MARK) for p in enc_parameters(g))


def test_converting_a_frozen_nodes_module_through_your_own_handle(swap: bool) -> None:
    """``g["enc"].net.double()``, not through ``module(g)``: the node stays frozen, is keyed
    anew, and unfreezes."""
    rec = Recorder()
    g = graph("per-example", rec)
    m = st.module(g)
    x32 = torch.randn(4, 64)
    m(x32)
    g["enc"].net.double()
    g["head"].out.double()
    backbone, head = reference(g)
    out = m(x32.double())
    assert computed(rec) == 8 and torch.equal(out, head(backbone(x32.double())))
    assert all(not p.requires_grad for p in enc_parameters(g))
    assert len(st.parameters(g)) == 2  # the head's
    g.freeze("enc", False)
    assert len(st.parameters(g)) == 2 + len(enc_parameters(g))


def test_a_dropped_module_whose_node_was_converted_lets_another_graph_train_it() -> None:
    """A node two graphs hold, frozen in one, converted by swap through the user's handle
    (its mark dropped with its attributes): when the freezing module goes, the other graph
    trains the node."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        enc = Backbone(4)
        pre = Graph.somatize(enc.with_id("enc") >> Head(32)).freeze("enc")
        tune = Graph.somatize(enc.with_id("enc") >> Head(32))
        frozen = st.module(pre)
        tuned = st.module(tune)  # noqa: F841 -- (alive, as a user's model is)
        enc.net.double()
        assert not any(hasattr(p, MARK) for p in enc.net.parameters())  # (swap_tensors')
        del frozen
        gc.collect()
        assert len(st.parameters(tune)) == 2 + len(list(enc.net.parameters()))
        assert all(p.requires_grad for p in enc.net.parameters())
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def test_a_conversion_making_new_parameters_moves_the_freeze_to_them() -> None:
    """Under ``set_overwrite_module_params_on_conversion(True)`` each parameter is replaced."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        g = graph("per-example")
        m = st.module(g)
        old = enc_parameters(g)
        m.double()
        new = enc_parameters(g)
        assert all(p is not q for p, q in zip(old, new))
        assert all(not q.requires_grad and getattr(q, MARK, False) for q in new)
        assert len(st.parameters(g)) == 2
        g.freeze("enc", False)
        assert len(st.parameters(g)) == 2 + len(new)
        assert all(q.requires_grad for q in enc_parameters(g))
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)


def test_a_conversion_failing_part_way_leaves_frozen_nodes_frozen_and_marked(
    swap: bool,
) -> None:
    g = graph("per-example")
    m = st.module(g)
    calls = []

    def fails_third(t: torch.Tensor) -> torch.Tensor:
        calls.append(t)
        if len(calls) == 3:
            raise RuntimeError("out of memory, say")
        return t.double()

    with pytest.raises(RuntimeError, match="out of memory, say"):
        m._apply(fails_third)
    assert all(getattr(p, MARK, False) and not p.requires_grad for p in enc_parameters(g))
    g.freeze("enc", False)
    assert len(st.parameters(g)) == 2 + len(enc_parameters(g))
    assert all(p.requires_grad for p in enc_parameters(g))
