"""``module(g)`` running: modes and devices reaching the nodes, graph changes seen, metrics and
step, the hot path staying free of keys, copies and pickles, and errors naming the node."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.execute import Program

from .tensor_nodes import Concat, Linear, tensor_codec


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


class Add3(Node):
    def forward(self, xs, ctx):
        a, b, c = xs  # (written for three inputs; the graph gives it two)
        return Done(Opaque(a + b + c))


def test_a_join_or_a_root_failing_on_what_it_received_is_told_what_that_was():
    """A join given another number of inputs than it unpacks, and a two-tower model given
    two inputs whose towers each expect one: the note says what the node received."""
    join = st.module(Graph.somatize((Linear(4, 3) | Linear(4, 3).with_id("b")) >> Add3())).eval()
    for _ in range(3):  # (calls alike after the first run on steps bound to the run)
        with pytest.raises(ValueError, match="not enough values to unpack") as e:
            join(torch.ones(2, 4))
        assert e.value.__notes__ == [
            "raised by node 'add3' (Add3); its input x was one tuple of its 2 inputs, from "
            "'linear', 'b' in the order their edges were added: unpack it, a, b = x"
        ]
    towers = st.module(Graph.somatize((Linear(4, 3) | Linear(6, 3).with_id("item")) >> Concat()))
    with pytest.raises(TypeError, match="must be Tensor, not tuple") as e:
        towers(torch.ones(2, 4), torch.ones(2, 6))
    (note,) = e.value.__notes__
    assert "node 'linear' (Linear); its input x was its graph's input, a tuple of 2" in note


def test_a_model_given_a_dataloader_batch_whole_is_told_to_take_its_inputs():
    """model(batch) on a DataLoader's [inputs, targets] (a fit splits them, a call does not):
    torch's own error, with a note saying to give the model the inputs alone."""
    from torch.utils.data import DataLoader, TensorDataset

    model = st.module(Graph.somatize(Linear(4, 3)))
    data = TensorDataset(torch.ones(8, 4), torch.zeros(8, dtype=torch.long))
    batch = next(iter(DataLoader(data, batch_size=4)))
    with pytest.raises(TypeError) as e:
        model(batch)
    (note,) = e.value.__notes__
    assert "node 'linear' (Linear); its input x was its graph's input, a list of 2" in note
    assert "give the graph its inputs alone, batch[0]: a fit splits each batch" in note
    assert model(batch[0]).shape == (4, 3)
