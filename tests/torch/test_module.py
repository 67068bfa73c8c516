"""``module(g)``, ``parameters(g)``, ``state(g)`` / ``load_state(g, s)``: registration,
modes, devices and dtypes, and the hot path staying free of keys."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.errors import StateError
from somatize.execute import Program

from .tensor_nodes import Layer, Linear, tensor_codec


class Holder(Node):
    """Modules in every place a node may keep them."""

    def __init__(self) -> None:
        self.lin = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(2))
        self.offset = torch.zeros(2)  # a plain tensor: a buffer
        self.blocks = [nn.Linear(2, 2), nn.Linear(2, 2)]
        self.heads = {"fr": nn.Linear(2, 1), "en": nn.Linear(2, 1)}
        self.nested = {"deep": [nn.Linear(2, 2)]}
        self.note = "not a module"

    def forward(self, x, ctx):
        h = self.lin(x) * self.scale + self.offset
        for b in self.blocks:
            h = b(h)
        h = self.nested["deep"][0](h)
        return Done(Opaque(self.heads["fr"](h) + self.heads["en"](h)))


HOLDER_KEYS = [
    "holder.blocks.0.bias",
    "holder.blocks.0.weight",
    "holder.blocks.1.bias",
    "holder.blocks.1.weight",
    "holder.heads.en.bias",
    "holder.heads.en.weight",
    "holder.heads.fr.bias",
    "holder.heads.fr.weight",
    "holder.lin.bias",
    "holder.lin.weight",
    "holder.nested.deep.0.bias",
    "holder.nested.deep.0.weight",
    "holder.offset",
    "holder.scale",
]


def test_modules_in_attributes_lists_and_dicts_register_under_the_node_id():
    g = Graph.somatize(Holder())
    assert sorted(st.module(g).state_dict()) == HOLDER_KEYS
    assert sorted(st.module(Graph.somatize(Holder())).state_dict()) == HOLDER_KEYS  # stable
    params = dict(st.module(g).named_parameters())
    assert params["holder.heads.fr.weight"] is g["holder"].heads["fr"].weight
    assert params["holder.scale"] is g["holder"].scale
    assert "holder.offset" not in params  # a buffer, not a parameter


def test_subgraph_modules_register_nested():
    sub = Graph().node("inner", Linear(3, 3))
    g = Graph().node("first", Linear(3, 3)).node("sub", sub).edge("first", "sub")
    m = st.module(g)
    assert sorted(m.state_dict()) == [
        "first.lin.bias",
        "first.lin.weight",
        "sub.inner.lin.bias",
        "sub.inner.lin.weight",
    ]
    assert dict(m.named_parameters())["sub.inner.lin.weight"] is sub["inner"].lin.weight
    m(torch.ones(1, 3)).sum().backward()
    assert sub["inner"].lin.weight.grad is not None


def test_subgraph_written_in_an_expression_registers_under_its_default_id_graph():
    g = Graph.somatize(Linear(2, 2) >> Graph.somatize(Linear(2, 2)) >> Linear(2, 2))
    m = st.module(g)
    assert "graph.linear.lin.weight" in m.state_dict()
    assert m.graph is g  # the attribute stays the graph; the node's modules are a child
    m.train()
    m.step = 4
    assert m.step == 4 and dict(m.named_children())["graph"].training
    st.load_state(g, st.state(g))
    assert m(torch.ones(1, 2)).shape == (1, 2)
    named = Graph.somatize(Linear(2, 2) >> Graph.somatize(Linear(2, 2)).with_id("block"))
    assert sorted(st.module(named).state_dict())[:2] == [
        "block.linear.lin.bias",
        "block.linear.lin.weight",
    ]


def test_mapped_node_registers_its_inner_nodes_modules():
    class Scale(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    g = Graph.somatize(Scale().mapped())
    assert sorted(st.module(g).state_dict()) == ["scale.lin.bias", "scale.lin.weight"]
    assert len(st.parameters(g)) == 2


def test_node_held_by_a_node_registers_nested():
    class Outer(Node):
        def __init__(self) -> None:
            self.helper = Linear(2, 2)

        def forward(self, x, ctx):
            return self.helper.forward(x, ctx)

    assert sorted(st.module(Graph.somatize(Outer())).state_dict()) == [
        "outer.helper.lin.bias",
        "outer.helper.lin.weight",
    ]


def test_ids_that_cannot_name_modules_are_refused_only_when_they_hold_modules():
    class Plain(Node):
        def forward(self, x, ctx):
            return Done(x)

    for bad in ("a.b", "forward", "training"):
        g = Graph().node(bad, Linear(2, 2))
        with pytest.raises(StateError, match=rf"node '{bad}' holds modules.*another id"):
            st.module(g)
    # the same ids on a node without modules are fine
    assert st.module(Graph().node("a.b", Plain())).state_dict() == {}


def test_attributes_that_cannot_name_modules_are_refused():
    class Shadow(Node):
        def __init__(self) -> None:
            self.modules = [nn.Linear(2, 2)]  # nn.Module.modules() exists
            self.training = True  # plain data under a module's name: fine

        def forward(self, x, ctx):
            return Done(Opaque(x))

    with pytest.raises(StateError, match=r"node 'shadow'.*attribute 'modules'.*rename"):
        st.module(Graph.somatize(Shadow()))


def test_dict_keys_that_cannot_name_modules_are_refused():
    class Bad(Node):
        def __init__(self) -> None:
            self.heads = {"a.b": nn.Linear(2, 2)}

        def forward(self, x, ctx):
            return Done(Opaque(x))

    with pytest.raises(StateError, match=r"bad\.heads\['a\.b'\].*without '\.'"):
        st.module(Graph.somatize(Bad()))


def test_module_is_one_per_graph_and_does_not_keep_the_graph_alive():
    g = Graph.somatize(Linear(2, 2))
    m = st.module(g)
    assert st.module(g) is m
    assert st.module(Graph.somatize(Linear(2, 2))) is not m
    ref = weakref.ref(g)
    del g, m
    gc.collect()
    assert ref() is None


def test_module_rejects_what_is_not_a_graph():
    with pytest.raises(TypeError, match="somatize Graph"):
        st.module(nn.Linear(2, 2))


def test_train_and_eval_reach_node_modules_and_ctx():
    seen = []

    class Mode(Node):
        def __init__(self) -> None:
            self.drop = nn.Dropout(0.5)

        def forward(self, x, ctx):
            seen.append((ctx.training, self.drop.training))
            return Done(Opaque(x))

    g = Graph.somatize(Mode())
    m = st.module(g)
    m.train()(torch.ones(1))
    m.eval()(torch.ones(1))
    assert seen == [(True, True), (False, False)]


def test_graph_changes_after_module_are_seen_on_the_next_call():
    g = Graph().node("a", Linear(2, 2))
    m = st.module(g)
    g.node("b", Linear(2, 2)).edge("a", "b")
    m(torch.ones(1, 2))
    assert "b.lin.weight" in m.state_dict()
    sub = Graph().node("inner", Linear(2, 2))
    g.node("sub", sub).edge("b", "sub")
    assert "sub.inner.lin.weight" in st.module(g).state_dict()
    assert any(isinstance(c, st.TensorCodec) for c in sub.codecs)  # the late subgraph is equipped


def test_module_and_its_readers_register_what_changed_without_a_call():
    g = Graph().node("a", Linear(2, 2))
    m = st.module(g)
    before = dict(m.named_children())
    assert st.module(g) is m and dict(m.named_children()) == before  # unchanged: kept as is
    g.node("b", Linear(2, 2)).edge("a", "b")
    assert "b.lin.weight" in dict(m.named_parameters())  # (the module's readers look first)
    assert st.module(g) is m and "b.lin.weight" in dict(m.named_parameters())
    g.freeze("b")
    assert st.module(g).b.training is False and not g["b"].lin.weight.requires_grad


def test_parameters_are_deduplicated_and_exclude_frozen_nodes():
    shared = nn.Linear(3, 3)
    g = Graph.somatize(
        Layer(shared).with_id("a") >> Layer(shared).with_id("b") >> Linear(3, 1).with_id("c")
    )
    params = st.parameters(g)
    assert len(params) == 4
    assert {id(p) for p in params} == {id(shared.weight), id(shared.bias)} | {
        id(p) for p in g["c"].lin.parameters()
    }
    g.freeze("c")
    assert {id(p) for p in st.parameters(g)} == {id(shared.weight), id(shared.bias)}


def test_state_is_detached_cpu_copies_named_as_state_dict():
    g = Graph.somatize(Linear(2, 2))
    snap = st.state(g)
    assert sorted(snap) == sorted(st.module(g).state_dict())
    w = g["linear"].lin.weight
    assert not snap["linear.lin.weight"].requires_grad
    snap["linear.lin.weight"].add_(1.0)
    assert not torch.equal(snap["linear.lin.weight"], w.detach())  # a copy, not a view


def test_load_state_round_trips_and_reports_every_problem():
    torch.manual_seed(0)
    g = Graph.somatize(Linear(2, 3) >> Linear(3, 1))
    torch.manual_seed(1)
    g2 = Graph.somatize(Linear(2, 3) >> Linear(3, 1))
    st.load_state(g2, st.state(g))
    for k, v in st.state(g2).items():
        assert_close(v, st.state(g)[k])

    bad = st.state(g)
    del bad["linear.lin.bias"]
    bad["nowhere.weight"] = torch.zeros(1)
    bad["linear_2.lin.weight"] = torch.zeros(5, 5)
    bad["linear_2.lin.bias"] = [0.0]
    with pytest.raises(StateError) as e:
        st.load_state(g, bad)
    msg = str(e.value)
    assert "missing keys: linear.lin.bias" in msg
    assert "unexpected keys: nowhere.weight" in msg
    assert "linear_2.lin.weight: graph has (1, 3), state has (5, 5)" in msg
    assert "not tensors: linear_2.lin.bias" in msg
    assert isinstance(e.value, ValueError)
    # nothing is loaded from a state that does not fit, not even the keys that do
    before = st.state(g)
    bad["linear.lin.weight"] = torch.zeros(3, 2)
    with pytest.raises(StateError):
        st.load_state(g, bad)
    for k, v in st.state(g).items():
        assert_close(v, before[k])


def test_to_dtype_moves_node_modules_and_tensors():
    class Scaled(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)
            self.gain = nn.Parameter(torch.ones(2))
            self.offset = torch.zeros(2)
            self.blocks = [nn.Linear(2, 2)]

        def forward(self, x, ctx):
            return Done(Opaque(self.blocks[0](self.lin(x) * self.gain + self.offset)))

    g = Graph.somatize(Scaled())
    m = st.module(g).to(torch.float64)
    node = g["scaled"]
    assert node.lin.weight.dtype == node.gain.dtype == node.offset.dtype == torch.float64
    assert node.blocks[0].weight.dtype == torch.float64
    assert dict(m.named_buffers())["scaled.offset"] is node.offset  # the node sees the moved buffer
    assert m(torch.ones(1, 2, dtype=torch.float64)).dtype == torch.float64


def test_placement_device_reaches_nodes_as_ctx_device():
    seen = {}

    class Where(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            seen[ctx.node] = ctx.device
            return Done(Opaque(self.lin(x.to(ctx.device or "cpu"))))

    g = Graph.somatize(Where().with_id("x") >> Where().with_id("y"))
    st.module(g)(torch.ones(1, 2))
    assert seen == {"x": None, "y": None}
    g.place("x", device="cpu")
    st.module(g)(torch.ones(1, 2))
    assert seen == {"x": "cpu", "y": None}


def test_metrics_and_step_reach_the_module():
    class Loss(Node):
        def forward(self, x, ctx):
            loss = x.pow(2).mean()
            return Done(Opaque(loss), metrics={"loss": loss.detach(), "step": ctx.step})

    g = Graph.somatize(Linear(2, 2) >> Loss())
    m = st.module(g)
    m.step = 7
    out = m(torch.ones(3, 2))
    assert m.metrics["loss"]["step"] == 7
    assert_close(m.metrics["loss"]["loss"], out.detach())


def test_tensor_inputs_pass_as_opaque_when_nothing_is_cached():
    got = []

    class Keep(Node):
        def forward(self, x, ctx):
            got.append(x)
            return Done(Opaque(x * 2))

    x = torch.ones(2, requires_grad=True)
    y = st.module(Graph.somatize(Keep()))(x)
    assert got[0] is x  # by identity: no copy, no check
    y.sum().backward()
    assert_close(x.grad, torch.full((2,), 2.0))


def test_hot_path_computes_no_key_and_hashes_nothing(monkeypatch):
    def no_keys(*args, **kwargs):
        raise AssertionError("the keyed path ran on a graph that remembers nothing")

    monkeypatch.setattr(Program, "run_keyed", no_keys)

    class Detached(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            return Done(self.lin(x))  # data: checked, never hashed

    g = Graph.somatize(Detached().with_id("enc") >> Linear(2, 2)).freeze("enc")
    m = st.module(g)
    for _ in range(3):
        m(torch.ones(4, 2)).sum().backward()
    assert tensor_codec(g).hashed == 0


def test_deep_copy_of_the_module_runs_its_own_nodes():
    """An EMA or a Lightning copy: copy.deepcopy(model) must not call the original's nodes."""
    torch.manual_seed(0)
    sub = Graph().node("inner", Linear(2, 2))
    g = Graph().node("a", Linear(2, 2)).node("sub", sub).node("z", Linear(2, 2))
    g.edge("a", "sub").edge("sub", "z").freeze("z")
    m = st.module(g)
    x = torch.ones(1, 2)
    before = m(x).detach()
    twin = copy.deepcopy(m)
    assert twin.graph is not g
    with torch.no_grad():  # every node of the copy becomes the identity
        for name, p in twin.named_parameters():
            p.copy_(torch.eye(2) if name.endswith("weight") else torch.zeros(2))
    x = torch.tensor([[1.0, -2.0]])
    assert_close(twin(x), x)  # an original node in the path would have changed it
    assert_close(m(torch.ones(1, 2)), before)
    assert not twin.get_parameter("z.lin.weight").requires_grad  # still frozen
    assert twin.get_parameter("z.lin.weight") is twin.graph["z"].lin.weight


def test_the_module_and_its_graph_pickle_after_use():
    """torch.save(model), a worker's task: the frozen-node runtime is made of classes."""
    import io
    import pickle

    torch.manual_seed(0)
    g = Graph.somatize(Linear(2, 2).with_id("a") >> Linear(2, 2).with_id("z")).freeze("z")
    m = st.module(g)
    x = torch.tensor([[1.0, -2.0]])
    want = m(x).detach()
    torch.save(m, io.BytesIO())
    twin = pickle.loads(pickle.dumps(m))
    assert_close(twin(x), want)
    assert not twin.get_parameter("z.lin.weight").requires_grad  # still frozen
    with torch.no_grad():  # the copy runs its own nodes
        twin.get_parameter("a.lin.weight").zero_()
    assert not torch.equal(twin(x), want)
    assert_close(m(x), want)
    assert pickle.loads(pickle.dumps(g)).memory.frozen == {"z"}


def test_a_shape_error_inside_a_node_names_the_node_on_every_path():
    """torch's own message is kept; a note names the node: on the module's one-tensor path,
    through the graph's hot path with several inputs, and on the keyed path."""
    g = Graph.somatize(Linear(4, 3).with_id("first") >> Linear(2, 1).with_id("second"))
    m = st.module(g)
    for call in (lambda: m(torch.ones(5, 4)), lambda: g.forward(Opaque(torch.ones(5, 4)))):
        with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as e:
            call()
        assert e.value.__notes__ == ["raised by node 'second' (Linear)"]
    g.watchers.append(Recorder())  # the keyed path
    with pytest.raises(RuntimeError, match="mat1 and mat2") as e:
        m(torch.ones(5, 4))
    assert e.value.__notes__ == ["raised by node 'second' (Linear)"]
