"""What does not export says so: torch.jit.script of module(g), a hook on a node's holdings
module (which the graph never calls), calling that module (found by an outside audit:
torch's own errors named neither the graph nor what works); and what works, works."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Conv(Node):
    def __init__(self) -> None:
        self.conv = nn.Conv2d(1, 2, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.conv(x)))


X = torch.randn(2, 1, 5, 5)


def test_jit_script_says_to_export_instead():
    model = st.module(Graph.somatize(Conv()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (torch deprecates jit)
        with pytest.raises(TypeError, match=r"cannot be scripted.*torch\.export\.export"):
            torch.jit.script(model)
    exported = torch.export.export(model, (X,))  # the path that works
    assert torch.equal(exported.module()(X), model(X))


def test_a_hook_on_a_nodes_holdings_warns_and_one_on_its_module_runs():
    model = st.module(Graph.somatize(Conv()))
    with pytest.warns(UserWarning, match=r"never runs.*model\.<node>\.<attribute>"):
        model.conv.register_forward_hook(lambda *a: None)
    # (before: backward hooks there never ran either, and said nothing)
    with pytest.warns(UserWarning, match=r"full backward hook .* never runs.*full_backward_hook"):
        model.conv.register_full_backward_hook(lambda *a: None)
    with pytest.warns(UserWarning, match=r"full backward hook .* never runs"):
        model.conv.register_full_backward_pre_hook(lambda *a: None)
    seen = []
    model.conv.conv.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    model(X)
    assert seen == [torch.Size([2, 2, 3, 3])]
    with pytest.raises(TypeError, match=r"holds the modules of a Conv node.*st\.module\(g\)\(x\)"):
        model.conv(X)


def test_tracing_or_exporting_a_cached_graph_says_to_turn_caching_off():
    from somatize import MemoryKeeper

    g = Graph.somatize(Conv(), keeper=MemoryKeeper()).freeze("conv").cache("conv", per="example")
    model = st.module(g).eval()
    with pytest.raises(TypeError, match=r"caches 'conv'.*g\.cache\('conv', False\)"):
        torch.export.export(model, (X,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=r"caches 'conv'.*cannot record a cache"):
            torch.jit.trace(model, X)
    g.cache("conv", False)
    exported = torch.export.export(model, (X,))
    with torch.no_grad():
        assert torch.equal(exported.module()(X), g["conv"].conv(X))


@pytest.mark.parametrize("strict", [False, True])
def test_a_module_never_called_exports_and_builds_its_program_once(strict):
    g = Graph.somatize(Conv())
    model = st.module(g)  # no forward yet: no program (its first forward builds it)
    assert g._program is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = torch.export.export(model, (X,), strict=strict)
    side_effects = [w for w in caught if "side effects" in str(w.message)]
    assert not side_effects  # forward writes nothing when no node reported metrics
    program = g._program
    assert program is not None  # built for the export, eagerly (dynamo traced no compiler)
    assert torch.equal(exported.module()(X), model(X))
    assert g._program is program  # the module's own call found it built
