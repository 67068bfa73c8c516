"""The Trainer's options and inputs: bf16 autocast, gradient clipping, max_steps,
eval_every_steps, evaluate, a DataLoader, a graph that outputs its own loss, node metrics."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.watchers import EpochEnd, Metrics
from tests.torch.trainer_helpers import Linear, batches, make_graph, plain_copy, quiet, sgd

# -- options ---------------------------------------------------------------------------


def test_bf16_autocast_runs_and_trains():
    g = make_graph()
    dtypes = []
    g["linear"].lin.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=3e-2),
        epochs=15,
        options=quiet(precision="bf16"),
    )
    data = batches(2)
    result = trainer.fit(g, data, val=data)
    assert set(dtypes) == {torch.bfloat16}
    assert all(v.dtype == torch.float32 for v in result.state.values())  # the weights stay fp32
    assert result.metrics[-1]["val_loss"] < 0.7 * result.metrics[0]["val_loss"]


def test_gradient_clipping_clips_the_update():
    data = batches(1)
    updates = {}
    for clip in (None, 0.01):
        g = make_graph()
        before = torch.cat([p.detach().flatten().clone() for p in st.parameters(g)])
        trainer = st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=1.0),
            options=quiet(clip_grad_norm=clip),
        )
        trainer.fit(g, data)
        after = torch.cat([p.detach().flatten() for p in st.parameters(g)])
        updates[clip] = before - after
    assert updates[None].norm() > 0.1  # without clipping the step is much larger
    torch.testing.assert_close(updates[0.01].norm(), torch.tensor(0.01))
    torch.testing.assert_close(updates[0.01], updates[None] * 0.01 / updates[None].norm())


def test_max_steps_stops_mid_epoch():
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, epochs=10, max_steps=8, options=quiet()
    )
    result = trainer.fit(make_graph(), batches(3), val=batches(1))
    assert (result.steps, result.epochs, len(result.losses)) == (8, 2, 8)
    assert [m["step"] for m in result.metrics] == [3, 6]  # epoch ends only

    unbounded = st.Trainer(loss=F.cross_entropy, optimizer=sgd, max_steps=7, options=quiet())
    assert unbounded.fit(make_graph(), batches(3)).steps == 7  # epochs run on until max_steps


def test_eval_every_steps():
    rec = Recorder()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=2,
        metrics={"acc": st.accuracy},
        watchers=[rec],
        options=quiet(eval_every_steps=2),
    )
    result = trainer.fit(make_graph(), batches(3), val=batches(2))
    assert [(m["step"], m["epoch"]) for m in result.metrics] == [(2, 0), (4, 1), (6, 1)]
    evals = [e for e in rec.of(Metrics) if e.node == ""]
    assert [e.step for e in evals] == [2, 4, 6]
    assert set(evals[0].values) == {"val_loss", "val_acc"}
    assert [e.metrics for e in rec.of(EpochEnd)] == [{}, {}]  # no evaluation at epoch ends
    assert result.best == min(m["val_loss"] for m in result.metrics)


def test_evaluate_weighs_batches_by_their_size():
    g = make_graph()
    data = batches(3, size=10) + batches(1, size=3, seed=5)
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, metrics={"acc": st.accuracy})
    got = trainer.evaluate(g, data)
    x = torch.cat([b[0] for b in data])
    y = torch.cat([b[1] for b in data])
    with torch.no_grad():
        out = plain_copy(g)(x)
    assert got["loss"] == pytest.approx(F.cross_entropy(out, y).item(), rel=1e-6)
    assert got["acc"] == pytest.approx(st.accuracy(out, y).item())
    assert st.module(g).training  # evaluation leaves the mode as it found it


def test_a_dataloader_trains_and_counts_its_dataset():
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=2, options=quiet())
    result = trainer.fit(make_graph(), loader)
    assert (result.steps, result.num_examples) == (14, 50)


def test_without_a_loss_the_graph_gets_the_whole_batch_and_outputs_the_loss():
    class MSE(Node):
        def forward(self, pair, ctx):
            out, y = pair
            return Done(Opaque(F.mse_loss(out, y)))

    class Model(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(4, 1)

        def forward(self, batch, ctx):
            x, y = batch
            return Done(Opaque((self.lin(x), y)))

    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(6, 4, generator=gen), torch.randn(6, 1, generator=gen)) for _ in range(4)]
    torch.manual_seed(0)
    g = Graph.somatize(Model() >> MSE())
    plain = copy.deepcopy(g["model"].lin)
    opts = quiet(shuffle=False)
    a = st.Trainer(optimizer=sgd, epochs=2, options=opts).fit(g, data, val=data)
    b = st.Trainer(loss=F.mse_loss, optimizer=sgd, epochs=2, options=opts).fit(
        plain, data, val=data
    )
    assert a.losses == b.losses
    assert a.metric("val_loss") == b.metric("val_loss")


def test_node_metrics_reach_watchers_and_nodes_see_the_step():
    steps = []

    class Head(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(8, 3)

        def forward(self, x, ctx):
            out = self.lin(x)
            if ctx.training:
                steps.append(ctx.step)
            return Done(Opaque(out), metrics={"mean": out.detach().mean()})

    torch.manual_seed(0)
    g = Graph.somatize(Linear(4, 8) >> Head())
    rec = Recorder()
    st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=2, watchers=[rec], options=quiet()).fit(
        g, batches(3)
    )
    node = [e for e in rec.of(Metrics) if e.node == "head"]
    assert [e.step for e in node] == [1, 2, 3, 4, 5, 6] == steps
    assert all(set(e.values) == {"mean"} for e in node)
