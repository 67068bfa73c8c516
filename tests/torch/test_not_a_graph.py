"""``st.module``, ``st.parameters``, ``st.state`` and ``st.load_state`` given something
other than a Graph (``somatize/torch/not_a_graph.py``): a node or a ``>>`` expression not
built yet, the graph's module itself, a plain ``nn.Module`` — each names the call to write."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Graph

from .tensor_nodes import Linear

CALLS = {
    "st.module": st.module,
    "st.parameters": st.parameters,
    "st.state": st.state,
    "st.load_state": lambda g: st.load_state(g, {}),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_node_or_an_expression_is_told_to_build_the_graph(call: str) -> None:
    for given, kind, what in (
        (Linear(2, 2), "Linear", "a node"),
        (Linear(2, 2) >> Linear(2, 2), "Seq", "an expression of nodes"),
    ):
        with pytest.raises(
            TypeError, match=rf"^{call}\(\) takes a somatize Graph, got {kind}: "
        ) as e:
            CALLS[call](given)
        assert f"{what}" in str(e.value) and f"Graph.somatize(...); {call}(g)" in str(e.value)


def test_the_graphs_module_is_told_to_pass_its_graph() -> None:
    g = Graph.somatize(Linear(2, 2))
    model = st.module(g)
    with pytest.raises(TypeError, match=r"st\.parameters\(model\.graph\) \(model\.parameters"):
        st.parameters(model)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"st\.state\(model\.graph\)"):
        st.state(model)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a graph's module already: use it as it is"):
        st.module(model)  # type: ignore[arg-type]
    assert st.module(model.graph) is model and len(st.parameters(model.graph)) == 2


def test_a_plain_module_is_told_to_use_it_as_it_is_or_hold_it_in_a_node() -> None:
    with pytest.raises(TypeError, match=r"got Linear: a plain nn\.Module is used as it is") as e:
        st.parameters(nn.Linear(2, 2))  # type: ignore[arg-type]
    assert "class Model(Node)" in str(e.value)
    with pytest.raises(TypeError, match=r"^st\.module\(\) takes a somatize Graph, got int: build"):
        st.module(42)  # type: ignore[arg-type]
    assert torch.is_tensor(st.state(Graph.somatize(Linear(2, 2)))["linear.lin.weight"])


def test_a_plain_module_fitted_is_told_how_to_load_a_checkpoint(tmp_path) -> None:
    # before: "is used as it is (model.parameters(), model.state_dict())", and docs/trainer.md's
    # trainer.test(ckpt_path="best") row, st.load_state(g, ...), only for a graph
    model = nn.Linear(4, 3)
    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]
    result = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        checkpoint=st.Checkpointing(tmp_path, best=1),
        options=st.Options(progress=False),
    ).fit(model, data, val=data[:1])
    with pytest.raises(TypeError, match=r"got Linear: a plain nn\.Module loads its weights") as e:
        st.load_state(model, st.load_checkpoint(result.best_checkpoint))  # type: ignore[arg-type]
    assert "model.load_state_dict(st.load_checkpoint(path)['model'])" in str(e.value)
    fresh = nn.Linear(4, 3)
    fresh.load_state_dict(st.load_checkpoint(result.best_checkpoint)["model"])  # as it says
    assert all(torch.equal(v, result.state[k]) for k, v in fresh.state_dict().items())
