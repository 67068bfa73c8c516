"""What a node holds, changed after ``module(g)``: a module assigned on the node
(``g["head"].lin = nn.Linear(...)``) is registered again by ``module(g)``, ``parameters(g)``,
``state(g)`` and the Trainer, with a handle on the module alive; one assigned on the module
(``model.head.lin = ...``) is written through to the node, so forward runs it."""

from __future__ import annotations

import copy
import sys

import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

from .tensor_nodes import Linear


def _graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Linear(4, 8).with_id("trunk") >> Linear(8, 2).with_id("head"))


def test_a_head_swapped_on_the_node_is_trained_by_the_trainer_with_a_handle_alive():
    g = _graph()
    model = st.module(g)  # kept, as PyTorch code keeps its module
    new = nn.Linear(8, 3)
    g["head"].lin = new
    trunk, head = copy.deepcopy(g["trunk"].lin), copy.deepcopy(new)  # plain torch, same start
    assert any(p is new.weight for p in st.parameters(g))
    assert st.state(g)["head.lin.weight"].shape == (3, 8)
    data = [(torch.randn(16, 4), torch.randint(0, 3, (16,))) for _ in range(3)]
    result = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        options=st.Options(progress=False, shuffle=False),
    ).fit(g, data)
    opt = torch.optim.SGD([*trunk.parameters(), *head.parameters()], lr=0.5)
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(head(trunk(x)), y).backward()
        opt.step()
    assert_close(new.weight, head.weight)  # the head forward uses is the one trained
    assert_close(g["trunk"].lin.weight, trunk.weight)
    assert_close(result.state["head.lin.weight"], head.weight)
    assert model.get_parameter("head.lin.weight") is new.weight
    assert sorted(model.state_dict()) == sorted(result.state)


class Holder(Node):
    def __init__(self) -> None:
        self.blocks = [nn.Linear(2, 2)]
        self.offset = torch.zeros(2)  # a buffer

    def forward(self, x, ctx):
        return Done(Opaque(self.blocks[0](x) + self.offset))


def test_a_list_item_or_a_buffer_replaced_on_the_node_is_registered_again():
    g = Graph().node("h", Holder())
    m = st.module(g)
    block = nn.Linear(2, 2)
    g["h"].blocks[0] = block  # in place, in the list the node holds
    assert m.get_parameter("h.blocks.0.weight") is not block.weight  # not before a refresh
    st.load_state(g, st.state(g))
    assert m.get_parameter("h.blocks.0.weight") is block.weight
    g["h"].offset = torch.ones(2)
    assert_close(st.state(g)["h.offset"], torch.ones(2))
    m.to(torch.float64)  # .to() moves what was swapped in, and the node follows
    assert block.weight.dtype == torch.float64 and g["h"].offset.dtype == torch.float64
    assert m(torch.ones(1, 2, dtype=torch.float64)).dtype == torch.float64


def test_nothing_swapped_registers_nothing_again_and_forward_never_compares(monkeypatch):
    g = _graph()
    m = st.module(g)
    children = dict(m.named_children())
    st.parameters(g), st.state(g)
    assert dict(m.named_children()) == children  # the same holdings: no new sync
    calls = []
    where = sys.modules["somatize.torch.module"]  # (somatize.torch.module is the function)
    real = where._signature
    monkeypatch.setattr(where, "_signature", lambda *a: calls.append(1) or real(*a))
    for _ in range(3):
        m(torch.ones(1, 4))
    assert calls == []  # the hot path reads only the graph's program
    st.parameters(g)
    assert calls  # (where it is compared)


def test_a_head_swapped_on_the_node_is_in_the_modules_own_parameters_and_is_trained():
    """Found by a review: an optimizer built from ``model.parameters()`` after
    ``g["head"].lin = ...`` (a handle made before) held the old head, and trained the trunk
    while the new head kept its random weights, silently."""
    g = _graph()
    model = st.module(g)
    new = nn.Linear(8, 3)
    g["head"].lin = new
    assert dict(model.named_modules())["head.lin"] is new
    assert [m for m in model.head.children()] == [new]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # nothing else called since the swap
    trunk, head = copy.deepcopy(g["trunk"].lin), copy.deepcopy(new)
    start = new.weight.detach().clone()
    plain = torch.optim.SGD([*trunk.parameters(), *head.parameters()], lr=0.5)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    for o, out in ((opt, model(x)), (plain, head(trunk(x)))):
        nn.functional.cross_entropy(out, y).backward()
        o.step()
    assert_close(new.weight, head.weight)  # moved, and as plain PyTorch moved it
    assert not torch.equal(new.weight, start)
    assert_close(g["trunk"].lin.weight, trunk.weight)

    class Scale(Node):
        def __init__(self) -> None:
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x, ctx):
            return Done(Opaque(x * self.w))

    g = Graph().node("s", Scale())
    model = st.module(g)
    g["s"].w = torch.ones(2)  # a parameter taken out: no longer trained
    assert list(model.parameters()) == []
    assert "s.w" in dict(model.named_buffers())


def test_a_tensor_a_forward_writes_on_its_node_costs_no_walk(monkeypatch):
    """What is counted is a module or parameter put in or taken out, not a tensor written:
    a node keeping its last output (``self.last = ...``) adds no walk to each step's
    ``parameters()``, nor does ``torch.func.functional_call`` swapping parameters in."""
    from somatize.node import HELD

    class Keep(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)
            self.last = None

        def forward(self, x, ctx):
            self.last = x.detach()
            return Done(Opaque(self.lin(x)))

    g = Graph().node("k", Keep())
    m = st.module(g)
    calls = []
    where = sys.modules["somatize.torch.module"]
    real = where._signature
    monkeypatch.setattr(where, "_signature", lambda *a: calls.append(1) or real(*a))
    before = HELD.swaps
    params = {k: v * 2 for k, v in m.named_parameters()}
    for _ in range(3):
        m(torch.ones(1, 2)).sum().backward()
        list(m.parameters())
        torch.func.functional_call(m, params, (torch.ones(1, 2),))
    assert HELD.swaps == before and calls == []
    g["k"].lin = nn.Linear(2, 2)
    assert HELD.swaps == before + 1
    list(m.parameters())
    list(m.parameters())
    assert calls == [1]  # one walk, then the count is caught up


def test_a_module_assigned_on_the_module_is_the_one_forward_runs():
    g = _graph()
    model = st.module(g)
    new = nn.Linear(8, 3)
    model.head.lin = new  # what one does with any nn.Module
    assert g["head"].lin is new and model.get_parameter("head.lin.weight") is new.weight
    trunk, head = copy.deepcopy(g["trunk"].lin), copy.deepcopy(new)
    x = torch.randn(5, 4)
    out, want = model(x), head(trunk(x))
    assert_close(out, want)
    out.square().sum().backward()
    want.square().sum().backward()
    assert_close(new.weight.grad, head.weight.grad)
    assert_close(g["trunk"].lin.weight.grad, trunk.weight.grad)
    assert any(p is new.weight for p in model.parameters())
    assert st.module(g).head.lin is new  # and a sync keeps it


def test_a_parameter_or_buffer_assigned_on_the_module_reaches_the_node_and_moves_with_it():
    class Scale(Node):
        def __init__(self) -> None:
            self.w = nn.Parameter(torch.ones(2))
            self.b = torch.zeros(2)

        def forward(self, x, ctx):
            return Done(Opaque(x * self.w + self.b))

    g = Graph().node("s", Scale())
    m = st.module(g)
    m.s.w = nn.Parameter(torch.full((2,), 3.0))
    m.s.b = torch.ones(2)
    assert_close(m(torch.ones(1, 2)), torch.full((1, 2), 4.0))
    m.to(torch.float64)
    assert g["s"].w.dtype == torch.float64 and g["s"].b.dtype == torch.float64
    m.s.extra = nn.Linear(2, 2)  # not an attribute of the node: registered here only
    assert "extra" not in vars(g["s"])


def test_the_signature_found_while_registering_equals_the_one_refresh_computes():
    from somatize.torch.module import _signature

    class Many(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)
            self.heads = [nn.Linear(2, 2), {"x": nn.Linear(2, 2)}]
            self.w = nn.Parameter(torch.ones(1))
            self.b = torch.zeros(2)
            self.k = 3

        def forward(self, x, ctx):
            return Done(Opaque(x))

    class Holder(Node):
        def __init__(self, inner: Node) -> None:
            self.inner = inner

        def forward(self, x, ctx):
            return Done(Opaque(x))

    sub = Graph.somatize(Many().with_id("deep"))
    g = Graph().node("a", Many()).node("b", Holder(Many())).node("m", Many().mapped())
    g.node("sub", sub).edge("a", "b").edge("b", "m").edge("m", "sub")
    assert st.module(g)._holds == _signature(g)


def test_eval_after_a_swap_on_the_node_reaches_the_new_module():
    """Found by a deployment review: ``model.eval()`` after ``g["head"].lin = ...`` left the
    new module in training mode, so its dropout ran at inference, silently."""
    g = _graph()
    model = st.module(g)
    g["head"].lin = nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 3))
    model.eval()
    assert not g["head"].lin.training
    x = torch.randn(5, 4)
    assert torch.equal(model(x), model(x))
    model.train()
    assert g["head"].lin.training


def _swapped_export(export, settle=False):
    g = _graph()
    model = st.module(g)
    x = torch.randn(5, 4)
    model(x)
    g["head"].lin = nn.Linear(8, 3)  # counted: the export's parameters() registers it
    if settle:
        model.eval()  # (what registers a module replaced inside a list: st.module(g) too)
    exported = export(model, x)
    with torch.no_grad():
        assert torch.equal(exported(x), g["head"].lin(g["trunk"].lin(x)))
    assert all(
        model.get_parameter(f"head.lin.{n}") is getattr(g["head"].lin, n)
        for n in ("weight", "bias")
    )  # the export's stand-ins for the parameters never stay registered
    return exported, g


def test_exporting_after_a_swap_and_eval_exports_the_new_weights():
    """Found by a deployment review: the exported program's state_dict held the old head's
    weights while it computed with the new ones as constants (strict: a KeyError)."""
    for strict, settle in ((False, True), (True, True), (False, False), (True, False)):
        program, g = _swapped_export(
            lambda m, x, strict=strict: torch.export.export(m, (x,), strict=strict).module(),
            settle,
        )
        assert torch.equal(program.state_dict()["head.lin.weight"], g["head"].lin.weight)


def test_tracing_after_a_swap_and_eval_traces_the_new_weights():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (torch deprecates jit)
        traced, g = _swapped_export(lambda m, x: torch.jit.trace(m, x), settle=True)
    assert torch.equal(dict(traced.named_parameters())["head.lin.weight"], g["head"].lin.weight)


def test_an_export_leaves_a_frozen_graph_with_a_bare_parameter_exportable_again():
    """Found by a deployment review: a check made during an export registered the
    export's stand-in tensors, and a strict export after it failed with a KeyError."""

    class Scaled(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(4, 3)
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x) * self.scale))

    g = Graph.somatize(Linear(4, 4).with_id("trunk") >> Scaled().with_id("head"))
    model = st.module(g.freeze("trunk")).eval()
    x = torch.randn(2, 4)
    for strict in (False, True, False):
        exported = torch.export.export(model, (x,), strict=strict)
        assert torch.equal(exported.module()(x), model(x))
    assert model.get_parameter("head.scale") is g["head"].scale


def test_state_dict_and_load_state_dict_after_a_swap_on_the_node_reach_the_new_module():
    """Found by a deployment review: weights loaded with ``model.load_state_dict`` after
    ``g["head"].lin = ...`` went into the old module, and forward ran the new one's random
    weights, silently; ``state_dict()`` returned the old module's."""
    trained = st.module(_graph()).state_dict()
    g = _graph()
    model = st.module(g)
    g["head"].lin = nn.Linear(8, 2)
    assert torch.equal(model.state_dict()["head.lin.weight"], g["head"].lin.weight)
    g["head"].lin = nn.Linear(8, 2)
    model.load_state_dict(trained)
    assert torch.equal(g["head"].lin.weight, trained["head.lin.weight"])
    g["head"].lin = nn.Linear(8, 2)
    wrapper = nn.Sequential(model)  # a module holding module(g): loads through it too
    wrapper.load_state_dict({f"0.{k}": v for k, v in trained.items()})
    assert torch.equal(g["head"].lin.weight, trained["head.lin.weight"])


def test_convert_sync_batchnorm_of_the_module_replaces_the_batchnorms_the_nodes_hold():
    class Enc(Node):
        def __init__(self) -> None:
            self.bn = nn.BatchNorm1d(4)  # held by the node itself
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))  # inside a container

        def forward(self, x, ctx):
            return Done(Opaque(self.seq(self.bn(x))))

    torch.manual_seed(0)
    g = Graph.somatize(Enc())
    model = st.module(g).eval()
    x = torch.randn(6, 4)
    before = model(x)
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert converted is model
    node = g["enc"]
    assert type(node.bn) is nn.SyncBatchNorm and node.bn is model.enc.bn
    assert type(node.seq[1]) is nn.SyncBatchNorm
    ran = []
    node.bn.register_forward_hook(lambda *_: ran.append(1))
    assert_close(model.eval()(x), before)  # the same statistics, now in SyncBatchNorm
    assert ran == [1]  # forward calls the converted module
    assert sorted(st.module(g).state_dict()) == sorted(model.state_dict())
