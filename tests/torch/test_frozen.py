"""Frozen nodes (no grads, eval mode, no_grad) and frozen + cached = computed once."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import CacheError, Done, Graph, Node, Opaque, ValueConversionError

from .tensor_nodes import Linear, tensor_codec


class Encoder(Node):
    """Embeds and averages; returns a *detached-able* tensor (data when run frozen)."""

    calls = 0

    def __init__(self, vocab: int, dim: int):
        self.emb = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(0.5)  # must stay off: a frozen node stays in eval mode

    def forward(self, ids, ctx):
        Encoder.calls += 1
        return Done(self.drop(self.emb(ids)).mean(dim=1))  # (batch, dim)


def frozen_graph() -> Graph:
    torch.manual_seed(0)
    g = Graph.somatize(Encoder(20, 8).with_id("enc") >> Linear(8, 3).with_id("head"))
    return g.freeze("enc").cache("enc")


def test_second_pass_skips_the_frozen_cached_encoder():
    g = frozen_graph()
    m = st.module(g).train()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    Encoder.calls = 0
    first = m(ids)
    assert Encoder.calls == 1
    second = m(ids.clone())  # equal content, another tensor: the same key
    assert Encoder.calls == 1
    assert_close(second, first)
    m(torch.tensor([[7, 8, 9]]))  # new input: computed
    assert Encoder.calls == 2


def test_load_state_with_new_weights_runs_the_encoder_again():
    g = frozen_graph()
    m = st.module(g)
    ids = torch.tensor([[1, 2, 3]])
    Encoder.calls = 0
    before = m(ids)
    snap = st.state(g)
    snap["enc.emb.weight"] = torch.randn(20, 8)
    st.load_state(g, snap)
    after = m(ids)
    assert Encoder.calls == 2
    assert not torch.allclose(after, before)
    m(ids)
    assert Encoder.calls == 2  # and the new answer is cached in turn


def test_in_place_change_to_frozen_weights_is_seen():
    g = frozen_graph()
    m = st.module(g)
    ids = torch.tensor([[1, 2]])
    Encoder.calls = 0
    m(ids)
    with torch.no_grad():
        g["enc"].emb.weight.mul_(2)
    m(ids)
    assert Encoder.calls == 2


def test_frozen_parameters_get_no_gradients_and_stay_in_eval_mode():
    g = frozen_graph()
    m = st.module(g).train()
    assert not m.enc.emb.weight.requires_grad
    assert not m.enc.drop.training and m.head.lin.training
    m.eval().train()
    assert not m.enc.drop.training
    m(torch.tensor([[1, 2, 3]])).sum().backward()
    assert g["enc"].emb.weight.grad is None
    assert g["head"].lin.weight.grad is not None
    assert all(p.requires_grad for p in st.parameters(g))
    assert len(st.parameters(g)) == 2


def test_frozen_node_runs_under_no_grad_unless_its_input_requires_grad():
    class Trainable(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)
            self.grad: list[bool] = []

        def forward(self, x, ctx):
            self.grad.append(torch.is_grad_enabled())
            return Done(Opaque(self.lin(x)))

    g = Graph.somatize(Trainable().with_id("a") >> Linear(2, 2).with_id("b")).freeze("a")
    st.module(g)(torch.ones(1, 2)).sum().backward()  # a batch: nothing before it to train
    assert g["a"].grad == [False] and g["b"].lin.weight.grad is not None
    x = torch.ones(1, 2, requires_grad=True)  # an input gradient (saliency): it passes
    st.module(g)(x).sum().backward()
    assert g["a"].grad == [False, True] and x.grad is not None
    assert g["a"].lin.weight.grad is None  # its own parameters stay frozen


def test_unfreezing_gives_back_gradients_and_train_mode():
    g = frozen_graph()
    m = st.module(g).train()
    g.freeze("enc", False).cache("enc", False)
    st.module(g)
    assert m.enc.emb.weight.requires_grad and m.enc.drop.training
    assert len(st.parameters(g)) == 3


def test_unfreezing_keeps_what_the_user_froze_by_hand():
    g = frozen_graph()
    head_bias = g["head"].lin.bias
    head_bias.requires_grad_(False)
    g.freeze("head")
    st.module(g)
    g.freeze("head", False)
    st.module(g)
    assert g["head"].lin.weight.requires_grad and not head_bias.requires_grad


def test_frozen_node_in_a_subgraph_is_frozen():
    sub = Graph().node("inner", Linear(2, 2)).freeze("inner")
    g = Graph().node("sub", sub).node("head", Linear(2, 2)).edge("sub", "head")
    m = st.module(g).train()
    assert not sub["inner"].lin.weight.requires_grad
    assert not m.get_submodule("sub.inner").training
    assert len(st.parameters(g)) == 2


def test_frozen_state_is_hashed_once_across_passes():
    g = frozen_graph()
    m = st.module(g)
    codec = tensor_codec(g)
    for _ in range(5):
        m(torch.tensor([[1, 2, 3]]))
    assert codec.hashed == 1  # the embedding weight; its version never moved


def test_cached_node_fed_by_an_opaque_input_is_an_error_naming_both():
    g = Graph.somatize(Linear(2, 2).with_id("a") >> Linear(2, 2).with_id("b")).cache("b")
    with pytest.raises(
        CacheError, match=r"node 'b' is cached but its input from node 'a' is Opaque"
    ):
        st.module(g)(torch.ones(1, 2))


def test_requires_grad_tensor_as_data_is_the_specific_error():
    class Leaky(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            return Done(self.lin(x))  # needs grad, not wrapped

    g = Graph.somatize(Leaky().with_id("enc"))
    with pytest.raises(ValueConversionError) as e:
        st.module(g)(torch.ones(1, 2))
    msg = str(e.value)
    assert "node 'enc'" in msg and "requires grad" in msg
    assert "wrap it in Opaque" in msg and "detach it" in msg
    assert isinstance(e.value, TypeError)


class Functional(Node):
    """Drops out through ctx.training, as F.dropout(x, training=ctx.training) does."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)
        self.seen: list[bool] = []

    def forward(self, x, ctx):
        self.seen.append(ctx.training)
        return Done(Opaque(nn.functional.dropout(self.lin(x), 0.5, training=ctx.training)))


def test_a_frozen_node_sees_ctx_training_false_as_its_modules_run_in_eval_mode():
    torch.manual_seed(0)
    enc, head = Functional(), Functional()
    g = Graph.somatize(enc.with_id("enc") >> head.with_id("head")).freeze("enc")
    x = torch.randn(3, 4)
    data = [(x, torch.randn(3, 4))]
    st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=st.Options(progress=False),
    ).fit(g, data)
    assert enc.seen == [False, False] and head.seen == [True, True]
    st.module(g).train()
    g.forward(x, training=True)  # (the graph's own run, in training mode)
    assert enc.seen[-1] is False and head.seen[-1] is True


def test_a_fitted_graph_dropped_is_freed_without_the_cyclic_collector():
    # before: graph -> its frozen-node runtime -> graph, and module -> forward -> module:
    # each fit's fresh graph (a sweep's) and its weights waited for a collection
    data = [(torch.randint(0, 20, (4, 3)), torch.randint(0, 3, (4,)))] * 2
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    gc.collect()
    gc.disable()
    try:
        g = frozen_graph()
        trainer.fit(g, data)
        graph, weight = weakref.ref(g), weakref.ref(g["head"].lin.weight)
        del g
        assert graph() is None and weight() is None
    finally:
        gc.enable()


def test_the_frozen_runtime_follows_its_graph_through_a_copy():
    g = frozen_graph()
    st.module(g)
    copied, wrap = copy.deepcopy((g, g.wrap))
    assert wrap._somatize_graph is copied and g.wrap._somatize_graph is g
