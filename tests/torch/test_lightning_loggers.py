"""Lightning's loggers, LR monitor and the Watch bridge to somatize watchers: one logged
run (a module-scoped fixture), several checks."""

from __future__ import annotations

import collections
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import LearningRateMonitor  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

import somatize.torch as st  # noqa: E402
from somatize import JsonLines, Recorder  # noqa: E402
from somatize.torch.lightning import Watch  # noqa: E402
from somatize.watchers import EpochEnd, FitEnd, FitStart, Metrics, StepEnd  # noqa: E402
from tests.torch.lightning_graphs import SGD, _graph, _lg, _loader, _trainer  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    NO_VAL,  # fitting without validation data is a normal run here, as in the Trainer
]


# -- loggers, LR monitor and the watcher bridge (one run, several checks) ----------------


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("logged")
    lg = _lg(
        _graph(), scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    )
    recorder = Recorder()
    watch = Watch([recorder, st.TensorBoard(root / "watcher"), JsonLines(root / "run.jsonl")])
    logger = TensorBoardLogger(str(root), name="tb", version=0)
    trainer = _trainer(
        root,
        max_epochs=2,
        logger=logger,
        callbacks=[LearningRateMonitor(logging_interval="step"), watch],
    )
    trainer.fit(lg, _loader(), _loader(seed=1))
    return SimpleNamespace(root=root, lg=lg, trainer=trainer, recorder=recorder, logger=logger)


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_learning_rate_monitor_logs_the_scheduled_rate(logged):
    lrs = [v for _, v in _scalars(Path(logged.logger.log_dir))["lr-SGD"]]
    # a plain scheduler steps once per epoch (4 steps each), as Lightning's default does
    assert lrs == pytest.approx([SGD] * 4 + [SGD * 0.5] * 4)


def test_tensorboard_logger_event_file_holds_node_metrics(logged):
    scalars = _scalars(Path(logged.logger.log_dir))
    assert {"train_loss", "val_loss", "val_acc", "hidden/mean", "val_hidden/mean"} <= set(scalars)
    assert len(scalars["hidden/mean"]) == logged.trainer.global_step == 8
    assert all(v >= 0 for _, v in scalars["hidden/mean"])  # a mean of relu outputs
    val_loss = [v for _, v in scalars["val_loss"]]
    assert val_loss == pytest.approx([r["val_loss"] for r in logged.lg.history], rel=1e-5)


def test_watch_forwards_lightnings_lifecycle_as_somatize_events(logged):
    rec = logged.recorder
    assert isinstance(rec.events[0], FitStart) and isinstance(rec.events[-1], FitEnd)
    assert (rec.events[0].epochs, rec.events[0].start_step) == (2, 0)
    steps = rec.of(StepEnd)
    assert [e.step for e in steps] == list(range(1, 9))
    assert [e.loss for e in steps] == pytest.approx(logged.lg.losses)
    assert [e.examples for e in steps] == [16] * 8
    assert [e.lr for e in steps] == pytest.approx([SGD] * 4 + [SGD * 0.5] * 4)
    metrics = [m for m in rec.of(Metrics) if m.node]
    assert {m.node for m in metrics} == {"hidden"} and len(metrics) == 8
    evaluations = [m for m in rec.of(Metrics) if not m.node]  # as the somatize Trainer sends
    assert [e.values["val_loss"] for e in evaluations] == [r["val_loss"] for r in logged.lg.history]
    epochs = rec.of(EpochEnd)
    assert [e.epoch for e in epochs] == [0, 1]
    assert [e.metrics["val_loss"] for e in epochs] == [r["val_loss"] for r in logged.lg.history]
    end = rec.of(FitEnd)[0]
    assert (end.step, end.epoch, end.pruned) == (8, 2, False)


def test_somatize_watchers_write_under_lightning(logged):
    scalars = _scalars(logged.root / "watcher")
    tags = {"train/loss", "train/lr", "val/loss", "val/acc", "val/hidden/mean", "node/hidden/mean"}
    assert tags <= set(scalars)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 9))
    records = JsonLines.read(logged.root / "run.jsonl")
    kinds = collections.Counter(r["event"] for r in records)
    # 8 node metrics (one per step) and 2 evaluations (node "", as the somatize Trainer sends)
    assert kinds == {"FitStart": 1, "StepEnd": 8, "Metrics": 10, "EpochEnd": 2, "FitEnd": 1}
