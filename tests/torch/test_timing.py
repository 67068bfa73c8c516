"""TrainResult.timing: where a fit's time went — data, steps, evaluation, checkpoints, other.

The exact tests run the fit on a clock of their own (``time.perf_counter`` replaced by one
that moves only when a dataset reads an example or the model runs), so each part's seconds
are known in advance, whatever the machine's speed. The others use the real clock with
sleeps as lower bounds only.
"""

from __future__ import annotations

import math
import pickle
import time

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import somatize.torch as st
from somatize.watchers import EpochEnd, Recorder

PARTS = ["data", "steps", "evaluation", "checkpoints", "other"]
EXAMPLE, FORWARD = 1.0, 1000.0  # a read example's seconds, a forward's, on the test's clock


class Clock:
    """``time.perf_counter`` for a fit: moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


class Examples(Dataset):
    """``n`` examples, each read taking ``EXAMPLE`` on ``clock`` (or sleeping ``sleep``)."""

    def __init__(self, n: int, clock: Clock | None = None, sleep: float = 0.0) -> None:
        gen = torch.Generator().manual_seed(n)
        self.x, self.y = torch.randn(n, 4, generator=gen), torch.randn(n, 1, generator=gen)
        self.clock, self.sleep = clock, sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.clock is not None:
            self.clock.now += EXAMPLE
        if self.sleep:
            time.sleep(self.sleep)
        return self.x[i], self.y[i]


class Net(nn.Module):
    """A linear model whose forward takes ``FORWARD`` on ``clock`` (or sleeps ``sleep``)."""

    def __init__(self, clock: Clock | None = None, sleep: float = 0.0) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.clock, self.sleep = clock, sleep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.clock is not None:
            self.clock.now += FORWARD
        if self.sleep:
            time.sleep(self.sleep)
        return self.lin(x)


def trainer(watchers=(), epochs: int = 2, checkpoint=None, **options) -> st.Trainer:
    return st.Trainer(
        loss=F.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        checkpoint=checkpoint,
        watchers=watchers,
        options=st.Options(**{"progress": False, **options}),
    )


def loader(n: int, clock: Clock | None = None, sleep: float = 0.0) -> DataLoader:
    return DataLoader(Examples(n, clock, sleep), batch_size=4)


def assert_adds_up(result: st.TrainResult) -> None:
    assert list(result.timing) == PARTS
    assert all(v >= 0 for v in result.timing.values()), result.timing
    assert math.isclose(sum(result.timing.values()), result.seconds, rel_tol=1e-9)


# a fit of 2 epochs of 4 batches of 4 examples, evaluated on 2 batches of 4 at each epoch's
# end and by the sanity check before training (its 2 batches: all of them)
EVALUATION = 2 * 4 * EXAMPLE + 2 * FORWARD


@pytest.mark.parametrize("watched", [False, True], ids=["fast path", "with watchers"])
def test_each_part_is_the_time_spent_in_it(clock, watched):
    rec = Recorder()
    result = trainer([rec] if watched else []).fit(Net(clock), loader(16, clock), loader(8, clock))
    assert result.timing == {
        "data": 2 * 16 * EXAMPLE,  # the dataset's reads, not the model's forwards
        "steps": 2 * 4 * FORWARD,
        "evaluation": 3 * EVALUATION,  # the sanity check's and two epochs' ends
        "checkpoints": 0.0,
        "other": 0.0,
    }
    assert result.seconds == sum(result.timing.values())
    if watched:  # each epoch's share, as EpochEnd tells it
        ends = rec.of(EpochEnd)
        assert [(e.data, e.steps) for e in ends] == [(16 * EXAMPLE, 4 * FORWARD)] * 2


def test_accumulated_batches_count_as_one_steps_waits(clock):
    result = trainer(accumulate=2).fit(Net(clock), loader(16, clock))
    assert (result.steps, result.timing["data"]) == (4, 2 * 16 * EXAMPLE)
    assert result.timing["steps"] == 2 * 4 * FORWARD


def test_a_resumed_fit_counts_its_own_time_not_its_checkpoints_run(clock, tmp_path):
    ckpt = st.Checkpointing(tmp_path / "ckpt", every_steps=1, keep=10)
    first = trainer(checkpoint=ckpt).fit(Net(clock), loader(16, clock), loader(8, clock))
    assert first.timing["steps"] == 2 * 4 * FORWARD

    # from the end of the first epoch's 2nd step: the 2 batches in front are read again
    mid = ckpt.file(2)
    assert st.load_checkpoint(mid)["position"] == 2
    again = trainer(checkpoint=ckpt).fit(
        Net(clock), loader(16, clock), loader(8, clock), resume=mid
    )
    assert again.steps == first.steps
    assert again.timing["data"] == 2 * 16 * EXAMPLE  # the epoch read whole, then the next
    assert again.timing["steps"] == (2 + 4) * FORWARD  # its own 6 steps, not the first 2
    assert again.timing["evaluation"] == 2 * EVALUATION  # no sanity check on a resume

    # a finished run resumed: nothing is trained, nothing waited for
    done = trainer(checkpoint=ckpt).fit(Net(clock), loader(16, clock), resume="last")
    assert (done.steps, done.timing["data"], done.timing["steps"]) == (8, 0.0, 0.0)
    assert done.seconds == sum(done.timing.values())


def test_a_slow_dataloader_shows_in_data_and_a_slow_model_in_steps():
    sleep = 0.002
    slow_data = trainer().fit(Net(), loader(16, sleep=sleep))
    assert_adds_up(slow_data)
    assert slow_data.timing["data"] >= 2 * 16 * sleep  # every example's read waited for
    slow_model = trainer(watchers=[Recorder()]).fit(Net(sleep=sleep), loader(16))
    assert_adds_up(slow_model)
    assert slow_model.timing["steps"] >= 2 * 4 * sleep  # every forward's


def test_a_slow_evaluation_shows_in_evaluation():
    sleep = 0.002
    result = trainer(sanity_val_batches=0).fit(Net(), loader(16), loader(8, sleep=sleep))
    assert_adds_up(result)
    assert result.timing["evaluation"] >= 2 * 8 * sleep  # two evaluations of 8 examples


@pytest.mark.parametrize("watched", [False, True], ids=["fast path", "with watchers"])
def test_a_checkpointing_run_counts_its_writes(tmp_path, watched):
    ckpt = st.Checkpointing(tmp_path / "ckpt", every_steps=2)
    watchers = [Recorder()] if watched else []
    result = trainer(watchers, checkpoint=ckpt).fit(Net(), loader(16), loader(8))
    assert_adds_up(result)
    assert result.timing["checkpoints"] > 0
    plain = trainer().fit(Net(), loader(16))
    assert_adds_up(plain)
    assert plain.timing["checkpoints"] == plain.timing["evaluation"] == 0.0  # none of either


def test_summary_and_a_pickled_result_carry_the_timing():
    result = trainer().fit(Net(), loader(8), loader(4))
    assert result.summary()["timing"] == result.timing
    assert result.summary()["timing"] is not result.timing  # a copy: plain data for logs
    again = pickle.loads(pickle.dumps(result))
    assert again.timing == result.timing and again.seconds == result.seconds


def test_tensorboard_draws_each_epochs_seconds_beside_where_they_went(clock, tmp_path):
    """Found by a usability audit: TensorBoard drew an epoch's ``time/data`` and
    ``time/steps``, not how long the epoch took — its evaluation and checkpoints left out.
    ``time/epoch`` is the seconds since the previous epoch ended (the first epoch's, since
    ``FitStart``: after the sanity check)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rec = Recorder()
    trainer([st.TensorBoard(tmp_path / "tb"), rec]).fit(
        Net(clock), loader(16, clock), loader(8, clock)
    )
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("time/epoch")]
    epoch = 16 * EXAMPLE + 4 * FORWARD + EVALUATION  # its reads, its steps, its evaluation
    assert got == [(4, epoch), (8, epoch)]
    assert [e.step for e in rec.of(EpochEnd)] == [4, 8]
