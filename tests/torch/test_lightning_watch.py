"""Watch (lightning_watch.py) under accumulate_grad_batches: one StepEnd per optimizer step, as the
somatize Trainer sends under Options(accumulate=)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

import somatize.torch as st  # noqa: E402
from somatize import Done, Graph, Node, Opaque, Recorder  # noqa: E402
from somatize.torch.lightning import LightningGraph, Watch  # noqa: E402
from somatize.watchers import Metrics, StepEnd  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [*QUIET, NO_VAL]


class Net(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(8, 3)

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(Opaque(out), metrics={"mean": out.detach().mean()})


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Net().with_id("net"))


def batches(n: int, size: int = 16, last: int | None = None):
    gen = torch.Generator().manual_seed(0)
    sizes = [size] * (n - 1) + [last or size]
    return [
        (torch.randn(s, 8, generator=gen), torch.randint(0, 3, (s,), generator=gen)) for s in sizes
    ]


def loader(data) -> DataLoader:
    x, y = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    return DataLoader(TensorDataset(x, y), batch_size=len(data[0][1]))


def lightning(**kw) -> L.Trainer:
    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return L.Trainer(**{**settings, **kw})


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


def test_one_step_end_per_optimizer_step_as_the_somatize_trainer_sends():
    data = batches(6)  # 2 full groups of 3 an epoch: both trainers take the same steps
    ours = Recorder()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=2,
        watchers=[ours],
        options=st.Options(accumulate=3, shuffle=False, progress=False),
    ).fit(graph(), data)
    theirs = Recorder()
    lg = LightningGraph(graph(), loss=F.cross_entropy, optimizer=sgd)
    lightning(max_epochs=2, accumulate_grad_batches=3, callbacks=[Watch([theirs])]).fit(
        lg, loader(data)
    )

    want, got = ours.of(StepEnd), theirs.of(StepEnd)
    assert [e.step for e in got] == [e.step for e in want] == [1, 2, 3, 4]
    assert [e.epoch for e in got] == [e.epoch for e in want] == [0, 0, 1, 1]
    assert [e.examples for e in got] == [e.examples for e in want] == [48] * 4
    assert [e.lr for e in got] == [e.lr for e in want]
    # the step's loss, not Lightning's loss / 3 (the gradients agree up to rounding: x / 3
    # against x * (16 / 48))
    assert [e.loss for e in got] == pytest.approx([e.loss for e in want], rel=1e-5)
    node = [m.step for m in theirs.of(Metrics) if m.node == "net"]
    assert node == [m.step for m in ours.of(Metrics) if m.node == "net"] == [1, 2, 3, 4]


def test_a_steps_loss_weighs_its_batches_by_their_examples():
    data = batches(5, last=4)  # groups of 2: (16, 16), (16, 16), (4)
    rec = Recorder()
    lin = graph()["net"].lin  # the starting weights: the first step's batches see them
    with torch.no_grad():
        first = [float(F.cross_entropy(lin(x), y)) for x, y in data[:2]]
    lg = LightningGraph(graph(), loss=F.cross_entropy, optimizer=sgd)
    lightning(max_epochs=1, accumulate_grad_batches=2, callbacks=[Watch([rec])]).fit(
        lg, loader(data)
    )
    steps = rec.of(StepEnd)
    assert [e.step for e in steps] == [1, 2, 3] and [e.examples for e in steps] == [32, 32, 4]
    # Watch weighs the batches it saw; the module weighs its own: one loss per step alike
    assert [e.loss for e in steps] == pytest.approx(lg.losses, rel=1e-6)
    assert lg.losses[0] == pytest.approx(sum(first) / 2, rel=1e-6)


class Plain(L.LightningModule):
    """Any LightningModule: Watch multiplies outputs["loss"] (loss / k) back."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = graph()["net"].lin
        self.batch_losses: list[float] = []

    def training_step(self, batch, i):
        x, y = batch
        loss = F.cross_entropy(self.lin(x), y)
        self.batch_losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return sgd(self.parameters())


def test_any_lightning_modules_step_loss_is_its_batches_mean():
    rec, plain = Recorder(), Plain()
    lightning(max_epochs=1, accumulate_grad_batches=3, callbacks=[Watch([rec])]).fit(
        plain, loader(batches(6))
    )
    b = plain.batch_losses
    assert [e.step for e in rec.of(StepEnd)] == [1, 2]
    assert [e.loss for e in rec.of(StepEnd)] == pytest.approx(
        [sum(b[:3]) / 3, sum(b[3:]) / 3], rel=1e-6
    )


def test_log_grad_norm_tells_the_norm_before_lightnings_clipping_as_the_trainer_does():
    data = batches(6)
    ours = Recorder()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=2,
        watchers=[ours],
        options=st.Options(accumulate=3, shuffle=False, progress=False, clip_grad_norm=0.1),
    ).fit(graph(), data)
    theirs, unasked = Recorder(), Recorder()
    lg = LightningGraph(graph(), loss=F.cross_entropy, optimizer=sgd)
    callbacks = [Watch([theirs], log_grad_norm=True), Watch([unasked])]
    lightning(
        max_epochs=2, accumulate_grad_batches=3, gradient_clip_val=0.1, callbacks=callbacks
    ).fit(lg, loader(data))
    want = [e.grad_norm for e in ours.of(StepEnd)]
    assert len(want) == 4 and all(n > 0.1 for n in want)  # clipping bit: these are before it
    assert [e.grad_norm for e in theirs.of(StepEnd)] == pytest.approx(want, rel=1e-5)
    assert [e.grad_norm for e in unasked.of(StepEnd)] == [None] * 4  # not asked: none


def test_log_grad_norm_is_a_bool():
    with pytest.raises(TypeError, match="log_grad_norm must be True or False"):
        Watch([], log_grad_norm="yes")  # type: ignore[arg-type]


class Kept(L.pytorch.loggers.Logger):
    """A logger keeping what Lightning logs: ``(step, metrics)``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "kept"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, {k: float(v) for k, v in metrics.items()}))


def test_the_epochs_mean_is_logged_as_train_loss_epoch_and_told_as_epoch_end_loss(tmp_path):
    """As ``self.log("train_loss", loss, on_epoch=True)`` makes it: the mean over the epoch's
    examples (steps of 32, 32 and 4), ``train_loss`` still logged every step under its name;
    ``ModelCheckpoint`` can monitor it without validation data. Watch's ``EpochEnd.loss``
    is the same mean, from the steps it told."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from somatize.watchers import EpochEnd

    def loss(out, y):
        ce = F.cross_entropy(out, y)
        return {"loss": ce, "ce": ce, "half": ce / 2}

    rec, kept = Recorder(), Kept()
    best = ModelCheckpoint(tmp_path, monitor="train_loss_epoch", save_top_k=1)
    lg = LightningGraph(graph(), loss=loss, optimizer=sgd)
    lightning(
        max_epochs=2,
        accumulate_grad_batches=2,
        logger=kept,
        log_every_n_steps=1,
        enable_checkpointing=True,
        callbacks=[Watch([rec]), best],
    ).fit(lg, loader(batches(5, last=4)))
    sizes = [32, 32, 4]
    want = [
        sum(v * n for v, n in zip(lg.losses[e * 3 : e * 3 + 3], sizes, strict=True)) / 68
        for e in range(2)
    ]
    logged = [m for _, m in kept.rows if "train_loss_epoch" in m]
    assert [m["train_loss_epoch"] for m in logged] == pytest.approx(want, rel=1e-6)
    assert [m["train_ce_epoch"] for m in logged] == pytest.approx(want, rel=1e-6)
    assert [m["train_half_epoch"] for m in logged] == pytest.approx([w / 2 for w in want], rel=1e-6)
    assert sum("train_loss" in m for _, m in kept.rows) == 6  # every step's, as before
    assert float(best.best_model_score) == pytest.approx(min(want), rel=1e-6)
    ends = rec.of(EpochEnd)
    assert [e.loss for e in ends] == pytest.approx(want, rel=1e-6)
    assert [e.terms["half"] for e in ends] == pytest.approx([w / 2 for w in want], rel=1e-6)
