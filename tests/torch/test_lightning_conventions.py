"""LightningGraph follows st.Trainer's conventions: the same arguments mean the same things."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import EarlyStopping  # noqa: E402

import somatize.torch as st  # noqa: E402
from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.errors import SettingError  # noqa: E402
from somatize.torch.lightning import LightningGraph, result  # noqa: E402
from tests.torch.lightning_quiet import QUIET  # noqa: E402

pytestmark = QUIET


class Out(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


@pytest.mark.parametrize(
    ("metrics", "match"),
    [
        ({"loss": nn.functional.nll_loss}, "metric name 'loss' is reserved"),
        ({"val_acc": st.accuracy}, "'val_acc' would be evaluated as 'val_val_acc'"),
        ([st.accuracy], "metrics is a dict name → fn, not a list"),
    ],
)
def test_metric_names_are_checked_as_by_the_trainer(metrics, match):
    g = Graph.somatize(Out())
    with pytest.raises(SettingError, match=match):
        LightningGraph(g, loss=nn.functional.cross_entropy, optimizer=sgd, metrics=metrics)
    with pytest.raises(SettingError, match=match):
        st.Trainer(loss=nn.functional.cross_entropy, optimizer=sgd, metrics=metrics)


class WithLoss(Node):
    """docs/trainer.md's node that computes its own loss from the whole batch."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, batch, ctx):
        x, y = batch  # the whole batch
        return Done(Opaque(nn.functional.cross_entropy(self.lin(x), y)))


def _loader(seed: int, n: int = 48, batch: int = 16) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen)
    return DataLoader(TensorDataset(x, x[:, :3].argmax(dim=1)), batch_size=batch)


def test_without_a_loss_lightning_gives_the_graph_the_whole_batch_and_logs_its_loss(tmp_path):
    torch.manual_seed(0)
    ours, theirs = Graph.somatize(WithLoss()), Graph.somatize(WithLoss())
    st.load_state(theirs, st.state(ours))
    ref = st.Trainer(
        optimizer=sgd,
        epochs=2,
        options=st.Options(shuffle=False, progress=False),
    ).fit(ours, _loader(0), val=_loader(1))

    lg = LightningGraph(theirs, loss=None, optimizer=sgd)
    stop = EarlyStopping("val_loss", patience=5)  # needs val_loss logged, or it raises
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[stop],
        default_root_dir=str(tmp_path),
    )
    trainer.fit(lg, _loader(0), _loader(1))
    r = result(trainer, lg)

    assert r.losses == pytest.approx(ref.losses, rel=1e-6)
    for name, value in ref.state.items():
        torch.testing.assert_close(r.state[name], value, rtol=1e-6, atol=1e-7, msg=name)
    assert [m["val_loss"] for m in lg.history] == pytest.approx(
        [m["val_loss"] for m in ref.metrics], rel=1e-6
    )
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(ref.metrics[-1]["val_loss"])
    tested = trainer.test(lg, _loader(2), verbose=False)
    evaluated = st.Trainer().evaluate(ours, _loader(2))
    assert tested[0]["test_loss"] == pytest.approx(evaluated["loss"], rel=1e-6)


class Steps(Node):
    """Records the ctx.step of every training call."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)
        self.seen: list[int] = []

    def forward(self, x, ctx):
        if ctx.training:
            self.seen.append(ctx.step)
        return Done(Opaque(self.lin(x)))


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_nodes_see_the_same_step_numbers_under_both_runners():
    torch.manual_seed(0)
    xs, ys = torch.randn(24, 4), torch.randint(0, 3, (24,))
    batches = [(xs[i : i + 8], ys[i : i + 8]) for i in range(0, 24, 8)]
    ours, theirs = Steps(), Steps()
    st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=sgd,
        epochs=2,
        options=st.Options(shuffle=False, progress=False),
    ).fit(Graph.somatize(ours), batches)
    lg = LightningGraph(Graph.somatize(theirs), loss=nn.functional.cross_entropy, optimizer=sgd)
    L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(lg, DataLoader(TensorDataset(xs, ys), batch_size=8))
    assert ours.seen == theirs.seen == [1, 2, 3, 4, 5, 6]


class _ScriptedScore(L.LightningModule):
    """Logs the next value of a script as val_score at each validation."""

    def __init__(self, values) -> None:
        super().__init__()
        self.lin, self.values, self.validations = nn.Linear(4, 3), list(values), 0

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.cross_entropy(self.lin(x), y)

    def validation_step(self, batch, i):
        self.log("val_score", torch.tensor(self.values[self.validations]), batch_size=1)

    def on_validation_epoch_end(self):
        self.validations += 1

    def configure_optimizers(self):
        return sgd(self.parameters())


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 0.9, 0.9, 0.95, 0.9, 0.8],  # a plateau: patience runs out
        [1.0, 0.9, float("nan"), 0.8, 0.7, 0.6],
        [1.0, 0.9, float("inf"), 0.8, 0.7, 0.6],
    ],
    ids=["plateau", "nan", "inf"],
)
def test_patience_stops_where_early_stopping_does(values):
    module = _ScriptedScore(values)
    L.Trainer(
        max_epochs=len(values),
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        callbacks=[EarlyStopping("val_score", patience=2, min_delta=0.02)],
    ).fit(module, _loader(0), _loader(1))
    scores = iter(values)
    ours = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=sgd,
        epochs=len(values),
        metrics={"score": lambda out, y: next(scores)},
        pruner=st.Patience("val_score", patience=2, min_delta=0.02),
        options=st.Options(progress=False, sanity_val_batches=0, limit_val_batches=1),
    ).fit(Graph.somatize(Out()), _loader(0), val=_loader(1))
    assert len(ours.metrics) == module.validations < len(values)


def test_val_check_interval_counts_as_eval_every_steps_with_check_val_every_n_epoch_none():
    """docs/trainer.md's table: val_check_interval=N, check_val_every_n_epoch=None is
    Options(eval_every_steps=N); Lightning's default (1) restarts the count each epoch."""
    train, val = _loader(0, n=40, batch=4), _loader(1, n=8, batch=4)  # 10 batches an epoch
    ours = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=sgd,
        epochs=3,
        options=st.Options(eval_every_steps=4, progress=False, sanity_val_batches=0),
    ).fit(Graph.somatize(Out()), train, val=val)

    def lightning_steps(**kw) -> list[int]:
        lg = LightningGraph(Graph.somatize(Out()), loss=nn.functional.cross_entropy, optimizer=sgd)
        L.Trainer(
            max_epochs=3,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            val_check_interval=4,
            **kw,
        ).fit(lg, train, val)
        return [r["step"] for r in lg.history]

    assert [m["step"] for m in ours.metrics] == [4, 8, 12, 16, 20, 24, 28]
    assert lightning_steps(check_val_every_n_epoch=None) == [4, 8, 12, 16, 20, 24, 28]
    assert lightning_steps() == [4, 8, 14, 18, 24, 28]  # batches 4 and 8 of each epoch
