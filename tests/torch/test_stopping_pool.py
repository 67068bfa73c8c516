"""``Options(stop_on=)`` in a run on a process pool (``st.executor``): the worker's fit
stops at the step's end and checkpoints, the caller's ``result()`` raises the same
``SystemExit`` (so the script exits as the signal would have made it: requeued), and the
run, called again, resumes from that checkpoint to the uninterrupted run's weights."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize.watchers import StepEnd
from tests.torch.trainer_helpers import batches, make_graph, quiet

pytestmark = pytest.mark.slow


class SignalAt:
    """A watcher sending this process SIGTERM when step ``at`` ends (a preemption)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_event(self, event) -> None:
        if isinstance(event, StepEnd) and event.step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def train(folder: str, at: int | None) -> st.TrainResult:
    """A run of 12 steps, checkpointed every 100 (so only a stop writes one mid-run)."""
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        watchers=[SignalAt(at)] if at is not None else [],
        checkpoint=st.Checkpointing(folder, every_steps=100),
        options=quiet(stop_on="SIGTERM"),
    ).fit(make_graph(), batches(6), resume="last")


def test_a_run_on_a_pool_stops_checkpoints_exits_143_and_resumes(tmp_path):
    with st.executor(workers=1) as pool:
        whole = pool.submit(train, str(tmp_path / "whole"), None).result()
        with pytest.raises(SystemExit) as stopped:
            pool.submit(train, str(tmp_path / "run"), 3).result()
        assert stopped.value.code == 143
        assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == ["step-000000003.ckpt"]
        resumed = pool.submit(train, str(tmp_path / "run"), None).result()  # (requeued)
    assert resumed.steps == whole.steps == 12
    assert resumed.losses == whole.losses
    for name, value in whole.state.items():
        assert torch.equal(resumed.state[name], value), name
