"""Freezing a node whose modules are held elsewhere too: by a node of another graph, or
by a copy of the module (``copy.deepcopy``, ``torch.save`` then ``torch.load``)."""

from __future__ import annotations

import copy
import gc
import subprocess
import sys
import textwrap

import pytest
import torch

import somatize.torch as st
from somatize import Graph
from somatize.errors import StateError

from .tensor_nodes import Linear


def two_graphs() -> tuple[Linear, Graph, Graph]:
    """A pretraining graph and a fine-tuning graph sharing one encoder node."""
    torch.manual_seed(0)
    enc = Linear(4, 4)
    pre = Graph.somatize(enc.with_id("enc") >> Linear(4, 2).with_id("head"))
    tune = Graph.somatize(enc.with_id("enc") >> Linear(4, 3).with_id("head"))
    return enc, pre, tune


def test_another_graphs_module_does_not_unfreeze_a_shared_node():
    enc, pre, tune = two_graphs()
    tune.freeze("enc")
    tuned = st.module(tune)
    kept = st.module(pre)  # noqa: F841 -- (alive, as a user's `model = st.module(pre)` is)
    assert not enc.lin.weight.requires_grad
    assert all(p is not enc.lin.weight for p in st.parameters(tune))
    x = torch.randn(3, 4, requires_grad=True)  # (input gradients: the node runs with grad on)
    tuned.train()(x).sum().backward()
    assert enc.lin.weight.grad is None


def test_training_a_graph_whose_node_another_graph_froze_is_an_error_naming_both():
    enc, pre, tune = two_graphs()
    kept = st.module(pre)  # noqa: F841
    tune.freeze("enc")
    tuned = st.module(tune)  # noqa: F841 -- (alive: its graph's freeze holds)
    with pytest.raises(StateError, match=r"'enc'.*enc\.lin\.weight.*freeze\('enc'") as e:
        st.parameters(pre)
    assert "deepcopy" in str(e.value)
    tune.freeze("enc", False)
    st.module(tune)
    assert enc.lin.weight.requires_grad and len(st.parameters(pre)) == 4


def test_a_node_frozen_in_two_graphs_stays_frozen_until_both_unfreeze_it():
    enc, pre, tune = two_graphs()
    pre.freeze("enc")
    tune.freeze("enc")
    kept = (st.module(pre), st.module(tune))  # noqa: F841
    tune.freeze("enc", False)
    st.module(tune)
    assert not enc.lin.weight.requires_grad
    pre.freeze("enc", False)
    st.module(pre)
    assert enc.lin.weight.requires_grad


def test_a_graph_dropped_while_freezing_a_node_leaves_it_to_the_others():
    enc, pre, tune = two_graphs()
    tune.freeze("enc")
    st.module(tune)
    del tune
    gc.collect()  # (a graph and its runtime wrap hold each other)
    assert len(st.parameters(pre)) == 4 and enc.lin.weight.requires_grad


def test_unfreezing_in_a_deepcopy_of_the_module_unfreezes():
    _, _, tune = two_graphs()
    tune.freeze("enc")
    twin = copy.deepcopy(st.module(tune)).graph
    twin.freeze("enc", False)
    assert len(st.parameters(twin)) == 4 and twin["enc"].lin.weight.requires_grad


def test_unfreezing_a_module_loaded_in_a_fresh_process_unfreezes(tmp_path, subprocess_env):
    _, _, tune = two_graphs()
    tune.freeze("enc")
    path = tmp_path / "model.pt"
    torch.save(st.module(tune), path)
    child = textwrap.dedent(f"""
        import torch
        import somatize.torch as st
        g = torch.load({str(path)!r}, weights_only=False).graph
        g.freeze("enc", False)
        print(len(st.parameters(g)))
    """)
    out = subprocess.run(
        [sys.executable, "-c", child], env=subprocess_env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4"]


def test_a_subgraph_two_graphs_hold_unfreezes_in_both_when_it_unfreezes_inside():
    torch.manual_seed(0)
    sub = Graph.somatize(Linear(4, 4).with_id("inner")).freeze("inner")
    a = Graph.somatize(sub.with_id("sub") >> Linear(4, 2).with_id("head"))
    b = Graph.somatize(sub.with_id("sub") >> Linear(4, 3).with_id("head"))
    kept = (st.module(a), st.module(b))  # noqa: F841
    assert len(st.parameters(a)) == 2
    sub.freeze("inner", False)
    assert len(st.parameters(a)) == 4 and len(st.parameters(b)) == 4


def test_a_freeze_whose_module_was_dropped_does_not_keep_another_graph_from_training():
    enc, pre, tune = two_graphs()
    kept = st.module(pre)  # noqa: F841
    tune.freeze("enc")
    st.module(tune)  # (dropped at once: nothing enforces the freeze any more)
    gc.collect()
    assert len(st.parameters(pre)) == 4 and enc.lin.weight.requires_grad
