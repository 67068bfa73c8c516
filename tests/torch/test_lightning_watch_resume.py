"""Watch (lightning_watch.py) on a fit resumed from a checkpoint (``ckpt_path=``): its
``FitStart`` tells where, and the run logs keep each step and evaluation once."""

from __future__ import annotations

import csv

import pytest

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import somatize.torch as st  # noqa: E402
from somatize import JsonLines, Recorder  # noqa: E402
from somatize.torch.lightning import Watch  # noqa: E402
from somatize.watchers import FitStart  # noqa: E402
from tests.torch.lightning_graphs import _graph, _lg, _loader, _trainer  # noqa: E402
from tests.torch.lightning_quiet import QUIET  # noqa: E402
from tests.torch.test_checkpoint_resume import Crash, CrashAt  # noqa: E402

pytestmark = [
    *QUIET,
    # ckpt_path="last" looks in the ModelCheckpoint's directory, which the first fit filled
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
    # resumed mid-epoch: Lightning skips the epoch's batches taken, as this test wants
    pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before"),
]


def fit(root, watchers, every_steps=None, **kw) -> None:
    """3 epochs of 4 steps, validated at each epoch's end; checkpoints at each epoch's end
    (after its validation), or every ``every_steps`` steps."""
    ckpt = ModelCheckpoint(
        root / "ckpt", save_last=True, save_top_k=-1, every_n_train_steps=every_steps
    )
    trainer = _trainer(root, max_epochs=3, callbacks=[Watch(watchers), ckpt])
    trainer.fit(_lg(_graph(0)), _loader(), _loader(seed=1), **kw)


def kinds(path) -> list[tuple]:
    return [
        (r["event"], r.get("step"), r.get("node"))
        for r in JsonLines.read(path)
        if r["event"] != "FitStart"
    ]


# killed at step 5 after the checkpoint of epoch 0's end (step 4, after its validation), and
# at step 6 after the checkpoint of step 3
@pytest.mark.parametrize(("every_steps", "crash_at", "start"), [(None, 5, 4), (3, 6, 3)])
def test_a_resumed_lightning_fit_logs_each_step_and_evaluation_once(
    tmp_path, every_steps, crash_at, start
):
    fit(tmp_path / "ref", [JsonLines(tmp_path / "ref.jsonl")], every_steps)
    log, table, told = tmp_path / "run.jsonl", tmp_path / "run.csv", Recorder()
    with pytest.raises(Crash):
        fit(tmp_path, [JsonLines(log), st.CSVLog(table), CrashAt(crash_at)], every_steps)
    fit(tmp_path, [JsonLines(log), st.CSVLog(table), told], every_steps, ckpt_path="last")
    (resumed,) = told.of(FitStart)
    # Lightning goes on after the step it checkpointed: an evaluation there is not made again
    assert (resumed.start_step, resumed.start_evaluated) == (start, True)
    assert kinds(log) == kinds(tmp_path / "ref.jsonl")
    assert [(e, s) for e, s, n in kinds(log) if n == ""] == [
        ("Metrics", 4),
        ("Metrics", 8),
        ("Metrics", 12),
    ]
    with open(table, newline="") as f:  # CSVLog keeps the evaluation at the start step too
        rows = [(r["kind"], int(r["step"])) for r in csv.DictReader(f)]
    assert rows.count(("eval", 4)) == 1 and [s for k, s in rows if k == "step"] == list(
        range(1, 13)
    )
