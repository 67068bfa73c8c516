"""``module(g)`` registers the nodes' modules and compiles no program: the first forward
does (eagerly, under ``torch.compile`` too), after registering again what changed since."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Graph
from somatize.execute import Program

from .tensor_nodes import Concat, Linear

module_py = importlib.import_module("somatize.torch.module")


def count_compiles(monkeypatch):
    calls: list[int] = []
    real = Program.compiled.__func__

    def compiled(cls, *args, **kwargs):
        calls.append(1)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(Program, "compiled", classmethod(compiled))
    return calls


def test_module_parameters_state_and_to_compile_no_program(monkeypatch):
    calls = count_compiles(monkeypatch)
    g = Graph.somatize(Linear(2, 3) >> Linear(3, 2))
    m = st.module(g)
    assert sorted(m.state_dict()) == [
        "linear.lin.bias",
        "linear.lin.weight",
        "linear_2.lin.bias",
        "linear_2.lin.weight",
    ]
    assert len(st.parameters(g)) == 4 and len(st.state(g)) == 4
    m.to(torch.float64).to(torch.float32)
    assert calls == []  # a module made for its parameters or state never needs a program
    x = torch.randn(4, 2)
    out = m(x)
    assert len(calls) == 1
    assert_close(out, g["linear_2"].lin(g["linear"].lin(x)))
    m(x)
    assert len(calls) == 1  # compiled once


def test_a_change_between_module_and_the_first_forward_is_registered_and_run():
    g = Graph.somatize(Linear(2, 2).with_id("a") >> Linear(2, 2).with_id("b"))
    m = st.module(g)
    g.node("c", Linear(2, 1)).edge("b", "c")
    g.freeze("a")
    x = torch.randn(3, 2)
    out = m(x)
    assert "c.lin.weight" in m.state_dict()
    assert not g["a"].lin.weight.requires_grad and not m.a.training
    want = g["c"].lin(g["b"].lin(g["a"].lin(x)))
    assert_close(out, want)
    out.sum().backward()
    assert g["a"].lin.weight.grad is None and g["c"].lin.weight.grad is not None


def test_a_change_before_any_call_is_in_state_dict_parameters_and_modes_of_a_held_module():
    g = Graph.somatize(Linear(2, 2).with_id("a"))
    m = st.module(g)
    g.node("c", Linear(2, 1)).edge("a", "c")  # the model grown with the handle alive
    assert "c.lin.weight" in m.state_dict()
    assert any(p is g["c"].lin.weight for p in m.parameters())
    assert any(name == "c.lin.bias" for name, _ in m.named_parameters())
    m.eval()
    assert not g["c"].lin.training
    g.freeze("a")
    assert [n for n, p in m.named_parameters() if p.requires_grad] == ["c.lin.weight", "c.lin.bias"]
    twin = Graph.somatize(Linear(2, 2).with_id("a"))
    copy_of = st.module(twin)
    twin.node("c", Linear(2, 1)).edge("a", "c")
    copy_of.load_state_dict(m.state_dict())  # (no "unexpected key c.lin.weight")
    assert torch.equal(twin["c"].lin.weight, g["c"].lin.weight)


def test_torch_compile_of_a_module_never_called_traces_once_and_runs_the_graph():
    torch.manual_seed(0)
    g = Graph.somatize(Linear(4, 4) >> (Linear(4, 3) | Linear(4, 5)) >> Concat())
    m = st.module(g)  # no eager call: the first trace finds no program
    traced: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        traced.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(m, backend=backend, fullgraph=True)  # fullgraph: no break
    x = torch.randn(3, 4)
    outs = [compiled(x) for _ in range(3)]
    assert len(traced) == 1  # no recompile once the program the first trace built exists
    assert sum(n.op == "call_function" for n in traced[0].graph.nodes) >= 3  # the graph's ops
    h = g["linear"].lin(x)
    want = torch.cat([g["linear_2"].lin(h), g["linear_3"].lin(h)], dim=-1)
    for out in outs:
        assert_close(out, want)


def test_prepare_carries_the_mark_assume_constant_result_sets():
    # _prepare is marked by hand (importing dynamo costs hundreds of modules): the mark must
    # stay the one torch._dynamo.assume_constant_result sets
    def f() -> int:
        return 0

    before = set(vars(f))
    marked = torch._dynamo.assume_constant_result(f)
    added = {k: v for k, v in vars(marked).items() if k not in before}
    assert added == {"_dynamo_marked_constant": True}
    assert all(getattr(module_py._prepare, k) == v for k, v in added.items())


def test_module_of_a_plain_sequential_graph_matches_nn_sequential_and_its_gradients():
    torch.manual_seed(0)
    g = Graph.somatize(Linear(3, 5) >> Linear(5, 2))
    ref = nn.Sequential(g["linear"].lin, g["linear_2"].lin)
    m = st.module(g)
    x = torch.randn(6, 3)
    out, want = m(x), ref(x)
    assert_close(out, want)
    (g_out,) = torch.autograd.grad(out.sum(), [g["linear"].lin.weight])
    (g_ref,) = torch.autograd.grad(want.sum(), [g["linear"].lin.weight])
    assert_close(g_out, g_ref)


def test_what_the_plan_checks_is_reported_by_the_first_call_and_then_runs():
    from somatize.errors import EmptyGraphError

    g = Graph()
    m = st.module(g)  # a module before its nodes: nothing to compile yet
    with pytest.raises(EmptyGraphError, match="has no nodes"):
        m(torch.ones(1, 2))
    g.node("a", Linear(2, 3))
    out = m(torch.ones(1, 2))  # registered and compiled by this call
    assert "a.lin.weight" in m.state_dict()
    assert_close(out, g["a"].lin(torch.ones(1, 2)))


def test_fit_reports_a_per_example_cache_on_a_trainable_node_before_its_first_step():
    from somatize import MemoryKeeper
    from somatize.errors import CacheError

    g = Graph.somatize(Linear(4, 2), keeper=MemoryKeeper()).cache("linear", per="example")
    st.module(g)  # registers; the plan that refuses it is not built yet
    batch = (torch.randn(3, 4), torch.randint(0, 2, (3,)))
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)
    )
    with pytest.raises(CacheError, match="neither frozen nor row-wise"):
        trainer.fit(g, [batch])
    assert g["linear"].lin.weight.grad is None  # no step ran
