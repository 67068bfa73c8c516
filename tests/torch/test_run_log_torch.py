"""JsonLines (run_log.py) under the Trainer: a fit killed after a checkpoint and resumed logs
each step and evaluation once, as an uninterrupted fit logs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import JsonLines
from somatize.watchers import EpochEnd
from tests.torch.test_checkpoint import Unsized
from tests.torch.test_checkpoint_resume import Crash, CrashAt, data, graph, trainer

TIMES = ("time", "run_id", "seconds", "data", "steps")  # what differs from fit to fit


def records(path: Path) -> list[dict[str, Any]]:
    """The log's records but its FitStarts, without what differs from fit to fit."""
    return [
        {k: v for k, v in r.items() if k not in TIMES}
        for r in JsonLines.read(path)
        if r["event"] != "FitStart"
    ]


def starts(path: Path) -> list[dict[str, Any]]:
    return [r for r in JsonLines.read(path) if r["event"] == "FitStart"]


# every_steps=3, eval_every_steps=4, 5 batches an epoch: killed at 7 (checkpoint 6, mid-epoch),
# 11 (checkpoint 10, an epoch's end) and 13 (checkpoint 12, after the evaluation of step 12)
@pytest.mark.parametrize(("crash_at", "evaluated"), [(7, False), (11, False), (13, True)])
def test_a_fit_killed_after_a_checkpoint_and_resumed_logs_as_an_uninterrupted_one(
    tmp_path, crash_at, evaluated
):
    def fit(folder, extra=(), resume=None):
        log = tmp_path / folder / "run.jsonl"
        watchers = [JsonLines(log), *extra]  # (the log is told each event before the crash)
        trainer(tmp_path / folder, watchers=watchers, pruner=None).fit(
            graph(0), data(), val=data(2), resume=resume
        )
        return log

    reference = fit("ref")
    with pytest.raises(Crash):
        fit("run", [CrashAt(crash_at)])
    assert JsonLines.read(tmp_path / "run" / "run.jsonl")[-1]["step"] == crash_at
    log = fit("run", resume="last")
    assert records(log) == records(reference)  # each step, evaluation and epoch once
    steps = [r["step"] for r in records(log) if r["event"] == "StepEnd"]
    assert steps == list(range(1, 21))
    resumed = starts(log)[-1]
    assert (resumed["start_step"], resumed["start_evaluated"]) == (crash_at - 1, evaluated)
    if evaluated:  # the evaluation at the checkpoint's step: the killed fit's, kept
        (kept,) = [r for r in JsonLines.read(log) if r["event"] == "Metrics" and r["step"] == 12]
        assert kept["run_id"] == starts(log)[0]["run_id"]


class DieAtEpochEnd:
    """The process dying after epoch 0's evaluation, before its end-of-epoch checkpoint."""

    def on_event(self, event) -> None:
        if isinstance(event, EpochEnd) and event.epoch == 0:
            raise Crash


def test_an_evaluation_after_the_checkpoint_of_its_step_is_logged_once(tmp_path):
    """Data without a length: the epoch's last step is checkpointed before the epoch's end
    is known, then the process dies after the evaluation that follows (not in the
    checkpoint: ``start_evaluated`` False), and the resumed fit evaluates there again."""

    def fit(folder, extra=(), resume=None):
        log = tmp_path / folder / "run.jsonl"
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            checkpoint=st.Checkpointing(tmp_path / folder / "ckpt", every_steps=2),
            watchers=[JsonLines(log), *extra],
            options=st.Options(progress=False),
        ).fit(graph(0), Unsized(data(4)), val=data(2), resume=resume)
        return log

    reference = fit("ref")
    with pytest.raises(Crash):
        fit("run", [DieAtEpochEnd()])
    log = fit("run", resume="last")
    resumed = starts(log)[-1]
    assert (resumed["start_step"], resumed["start_position"]) == (4, 4)
    assert resumed["start_evaluated"] is False
    assert records(log) == records(reference)
    evals = [r for r in JsonLines.read(log) if r["event"] == "Metrics" and r["node"] == ""]
    assert [(r["step"], r["run_id"]) for r in evals] == [
        (4, resumed["run_id"]),
        (8, resumed["run_id"]),
    ]


def test_a_fit_killed_before_its_first_checkpoint_and_fitted_again_replaces_its_log(tmp_path):
    log = tmp_path / "run.jsonl"
    with pytest.raises(Crash):  # checkpoints every 3 steps: none yet
        trainer(tmp_path, watchers=[JsonLines(log), CrashAt(2)], pruner=None).fit(
            graph(0), data(), val=data(2)
        )
    assert st.Checkpointing(tmp_path / "ckpt").last() is None
    trainer(tmp_path, watchers=[JsonLines(log)], pruner=None).fit(
        graph(0), data(), val=data(2), resume="last"
    )
    (start,) = starts(log)  # the killed attempt's records are gone, its FitStart too
    assert start["resuming"] is True and start["start_step"] == 0
    reference = tmp_path / "ref.jsonl"
    trainer(tmp_path / "ref", watchers=[JsonLines(reference)], pruner=None).fit(
        graph(0), data(), val=data(2)
    )
    assert records(log) == records(reference)
