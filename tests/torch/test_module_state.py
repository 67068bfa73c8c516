"""``parameters(g)``, ``state(g)`` / ``load_state(g, s)`` and ``module(g).to(dtype)``:
deduplicated parameters, detached copies, every problem of a state reported, dtypes moved."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import StateError

from .tensor_nodes import Layer, Linear


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


class Remembers(Node):
    """Holds a layer, a tensor set in __init__ (state), and one it sets in forward."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)
        self.scale = torch.ones(3)
        self.calls = torch.zeros(())

    def forward(self, x: Any, ctx: Any) -> Done:
        h = self.lin(x) * self.scale
        self.last = h.detach()  # what the last batch gave: not the node's state
        self.calls = self.calls + 1  # held since __init__: state, though set again here
        return Done(Opaque(h))


def test_a_tensor_a_forward_sets_is_not_state_so_a_snapshot_loads_into_a_fresh_copy() -> None:
    def fresh() -> Graph:
        torch.manual_seed(0)
        return Graph.somatize(Remembers())

    g = fresh()
    m = st.module(g)
    m(torch.randn(5, 4))
    m(torch.randn(2, 4))  # another batch size: the transient tensor's shape changes
    snap = st.state(g)
    assert sorted(snap) == [
        "remembers.calls",
        "remembers.lin.bias",
        "remembers.lin.weight",
        "remembers.scale",
    ]
    assert "remembers.last" in dict(m.named_buffers())  # still moved by .to(), as a buffer
    g2 = fresh()
    st.module(g2).load_state_dict(snap)  # a fresh copy, never called: no 'last' yet
    assert g2["remembers"].calls.item() == 2.0
    m(torch.randn(7, 4))
    st.module(g).load_state_dict(snap)  # into itself after a batch of another size
    assert g["remembers"].last.shape == (7, 3)


def _misfit(g: Graph, snapshot: dict[str, Any]) -> RuntimeError:
    with pytest.raises(RuntimeError, match="Error.s. in loading state_dict for GraphModule") as e:
        st.module(g).load_state_dict(snapshot)
    return e.value


def test_module_load_state_dict_keeps_torchs_error_and_adds_the_fix_as_a_note() -> None:
    g = Graph.somatize(Linear(3, 2).with_id("enc") >> Linear(2, 2).with_id("head"))
    state = st.state(g)

    # a plain model's state_dict: the graph's names without the node ids
    g1 = Graph.somatize(Linear(3, 2).with_id("enc"))
    short = {k.split(".", 1)[1]: v for k, v in st.state(g1).items()}
    (note,) = _misfit(g1, short).__notes__
    assert "lack the graph's node ids" in note and "'lin.bias' is 'enc.lin.bias'" in note
    assert note.endswith("for graph_name in model.state_dict()}")

    (note,) = _misfit(g, {"model": state, "step": torch.tensor(3)}).__notes__
    assert note.endswith("model.load_state_dict(st.load_checkpoint(path)['model'])")

    (note,) = _misfit(g, {f"module.{k}": v for k, v in state.items()}).__notes__
    assert "prefix 'module.'" in note

    swapped = {k.replace("enc.", "x.", 1): v for k, v in state.items()}
    (note,) = _misfit(g, swapped).__notes__  # a node under another id: named
    assert "the state's 'x' is the graph's 'enc'" in note
    foreign = {k.replace("enc.lin.", "x.other.", 1): v for k, v in state.items()}
    assert not getattr(_misfit(g, foreign), "__notes__", None)  # no fix to name: torch's alone

    with pytest.raises(RuntimeError, match="size mismatch") as e:
        st.module(g).load_state_dict({**state, "head.lin.weight": torch.zeros(5, 2)})
    assert not getattr(e.value, "__notes__", None)

    assert st.module(g).load_state_dict(state).missing_keys == []  # a fit loads as before
    assert st.module(g1).load_state_dict(short, strict=False).unexpected_keys == list(short)


def test_load_state_names_a_renamed_node_and_its_fix_runs() -> None:
    class Branch(Node):
        def __init__(self, width: int) -> None:
            self.net = nn.Sequential(nn.Linear(4, width), nn.ReLU())

        def forward(self, x, ctx):
            return Done(Opaque(self.net(x)))

    def fork(ids: tuple[str, str], width: int = 3) -> Graph:
        return Graph.somatize(Branch(width).with_id(ids[0]) | Branch(width).with_id(ids[1]))

    state = st.state(fork(("left", "right")))
    g = fork(("left", "rite"))
    with pytest.raises(StateError, match="the state's 'right' is the graph's 'rite'") as e:
        st.load_state(g, state)
    fix = str(e.value).split("rename the state's keys: ", 1)[1]
    code, ids = fix.rstrip(")").split(" with ids = ")
    st.load_state(g, eval(code, {"ids": eval(ids), "state": state}))  # the fix, as given
    assert torch.equal(g["rite"].net[0].weight, state["right.net.0.weight"])
    # two nodes of the same layers both renamed: which is which cannot be told, none named
    with pytest.raises(StateError, match="was it saved from a different graph") as e:
        st.load_state(fork(("a", "b")), state)
    # the same names, other shapes: built with other sizes, not another graph
    with pytest.raises(StateError, match="built with other sizes than the state's") as e:
        st.load_state(fork(("left", "right"), width=5), state)
    assert "different graph" not in str(e.value)


def test_module_load_state_dict_of_a_weight_average_alone_names_the_payload() -> None:
    g = Graph.somatize(Linear(3, 2).with_id("enc") >> Linear(2, 2).with_id("head"))
    g.freeze("enc")  # a frozen parameter is not averaged: the average lacks it
    average = {k: v for k, v in st.state(g).items() if k.startswith("head.")}
    (note,) = _misfit(g, average).__notes__
    assert "['ema']['state']" in note
    assert "model.load_state_dict({**payload['model'], **payload['ema']['state']})" in note
    (note,) = _misfit(g, {"decay": 0.9, "state": average, "updates": 3}).__notes__
    assert "its ['ema']" in note and note.startswith("this is a checkpoint's weight average")
