"""``Options(max_time=...)``: a budget of training time, checked after each step, counted
across resumes (Lightning's ``max_time``).

The clock is a fake one that a node moves one second per forward, so each test knows at
which step the budget is spent: no test waits for, or depends on, real time."""

from __future__ import annotations

import datetime
import itertools
import time

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError
from somatize.watchers import Recorder

NOW = [0.0]


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    NOW[0] = 0.0
    monkeypatch.setattr(time, "monotonic", lambda: NOW[0])


class Tick(Node):
    """A linear layer whose every training forward takes one (fake) second."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 1)

    def forward(self, x, ctx):
        if ctx.training:
            NOW[0] += 1.0
        return Done(Opaque(self.lin(x)))


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(5)]


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Tick())


def trainer(
    max_time=None, ckpt=None, watchers=(), epochs: int = 3, max_steps=None, **options
) -> st.Trainer:
    return st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        max_steps=max_steps,
        checkpoint=st.Checkpointing(ckpt) if ckpt is not None else None,
        watchers=watchers,
        options=st.Options(max_time=max_time, progress=False, **options),
    )


@pytest.mark.parametrize(
    "value", [3.5, datetime.timedelta(seconds=3.5), "00:00:00:04"], ids=["s", "td", "dhms"]
)
def test_the_run_stops_after_the_step_that_spends_the_budget(value):
    result = trainer(value).fit(graph(), data())
    assert result.timed_out and result.steps == 4  # spent after the 4th second
    assert result.epochs == 0  # in the middle of the first epoch of 5 steps


@pytest.mark.parametrize("path", ["fast", "step"])
def test_a_fresh_run_takes_a_step_however_small_its_budget(monkeypatch, path):
    """The budget is read after each step: time that passes before the first (here, every
    reading of the clock moves it a second) does not stop a fresh run before it."""
    readings = itertools.count()
    monkeypatch.setattr(time, "monotonic", lambda: float(next(readings)))
    watchers = [Recorder()] if path == "step" else []
    result = trainer(1e-9, watchers=watchers).fit(graph(), data())
    assert result.timed_out and result.steps == 1 and len(result.losses) == 1


@pytest.mark.parametrize("path", ["fast", "step"])
def test_what_it_trained_equals_a_run_of_that_many_steps(path):
    watchers = [Recorder()] if path == "step" else []  # a watcher takes the step path
    timed = trainer(7.5, watchers=watchers).fit(graph(), data())
    plain = trainer(watchers=watchers, max_steps=8).fit(graph(), data())
    assert timed.timed_out and not plain.timed_out and timed.steps == plain.steps == 8
    assert timed.losses == plain.losses
    assert all(torch.equal(timed.state[k], plain.state[k]) for k in plain.state)


def test_a_budget_the_run_does_not_reach_changes_nothing():
    timed, plain = trainer(1e6).fit(graph(), data()), trainer().fit(graph(), data())
    assert not timed.timed_out and timed.steps == plain.steps == 15
    assert all(torch.equal(timed.state[k], plain.state[k]) for k in plain.state)


def test_it_counts_across_resumes_and_a_larger_budget_goes_on_bitwise(tmp_path):
    first = trainer(3.5, ckpt=tmp_path).fit(graph(), data())
    assert first.timed_out and first.steps == 4
    assert first.checkpoint is not None and first.checkpoint == str(
        st.Checkpointing(tmp_path).file(4)
    )
    again = trainer(3.5, ckpt=tmp_path).fit(graph(), data(), resume="last")
    assert again.timed_out and again.steps == 4  # its budget was spent: no step taken
    more = trainer(6.5, ckpt=tmp_path).fit(graph(), data(), resume="last")
    assert more.timed_out and more.steps == 7  # 4 seconds before, 3 now: 7 in all
    rest = trainer(None, ckpt=tmp_path).fit(graph(), data(), resume="last")
    plain = trainer().fit(graph(), data())
    assert not rest.timed_out and rest.steps == plain.steps == 15
    assert rest.losses == plain.losses
    assert all(torch.equal(rest.state[k], plain.state[k]) for k in plain.state)


def test_the_epoch_that_spends_it_at_its_last_step_still_ends_and_evaluates():
    val = data()[:2]
    result = trainer(5.0, epochs=3).fit(graph(), data(), val)
    assert result.timed_out and result.steps == 5 and result.epochs == 1
    assert [m["step"] for m in result.metrics] == [5]


@pytest.mark.parametrize(
    "bad", [0, -1.0, float("nan"), float("inf"), True, "1h", "00:00:61", [3], "1:2:3"]
)
def test_a_budget_that_is_not_a_positive_duration_is_refused_naming_the_forms(bad):
    with pytest.raises(SettingError, match=r"max_time"):
        st.Options(max_time=bad)


@pytest.mark.parametrize("path", ["fast", "step"])
def test_a_run_out_of_time_mid_epoch_evaluates_the_model_it_returns(path):
    # it stopped without an evaluation: metrics and best were of the model of the last
    # epoch's end, or none at all (Lightning's Timer asks for a validation when it stops)
    val = data()[:2]
    watchers = [Recorder()] if path == "step" else []
    result = trainer(3.5, watchers=watchers).fit(graph(), data(), val)
    assert result.timed_out and result.steps == 4 and result.epochs == 0
    assert [m["step"] for m in result.metrics] == [4]
    net = st.module(graph())
    net.load_state_dict(result.state)
    alone = trainer().evaluate(net, val)
    assert result.metrics[-1]["val_loss"] == pytest.approx(alone["loss"], rel=1e-6)
    assert result.best == result.metrics[-1]["val_loss"]


def test_out_of_time_in_an_epoch_that_does_not_evaluate_or_at_max_steps_it_does_not():
    val = data()[:2]
    skipped = trainer(3.5, eval_every_epochs=2).fit(graph(), data(), val)
    assert skipped.timed_out and skipped.metrics == []  # epoch 0's end is no evaluation
    at_steps = trainer(max_steps=4).fit(graph(), data(), val)
    assert at_steps.metrics == []  # (max_steps stops without one, as in Lightning)


def test_a_resumed_run_whose_budget_is_spent_evaluates_no_more(tmp_path):
    val = data()[:2]
    first = trainer(3.5, ckpt=tmp_path).fit(graph(), data(), val)
    again = trainer(3.5, ckpt=tmp_path).fit(graph(), data(), val, resume="last")
    assert again.steps == 4 and again.metrics == first.metrics and len(first.metrics) == 1


def _tracked(max_time, ckpt, lr=0.1, **kwargs) -> st.Trainer:
    return st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
        epochs=3,
        checkpoint=ckpt,
        options=st.Options(max_time=max_time, progress=False),
        **kwargs,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pruner": lambda: st.Patience("val_loss", patience=1)},
        {"scheduler": lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)},
    ],
    ids=["patience", "plateau"],
)
def test_the_evaluation_at_a_time_out_asks_no_pruner_nor_plateau(tmp_path, kwargs):
    """Found by an outside audit: it reported to the pruner and stepped the plateau
    scheduler, both then checkpointed, so a run resumed with a larger budget was pruned,
    or cut its rate, at other steps than one never stopped."""
    val = data()[:2]  # at lr=1 the loss climbs: the time-out's is the best evaluation

    def fit(max_time, ckpt, resume=None):
        made = {k: (v() if k == "pruner" else v) for k, v in kwargs.items()}
        return _tracked(max_time, ckpt, lr=1.0, **made).fit(graph(), data(), val, resume=resume)

    plain = fit(None, None)
    stopped = fit(3.5, st.Checkpointing(tmp_path))
    assert stopped.timed_out and [m["step"] for m in stopped.metrics] == [4]
    rest = fit(None, st.Checkpointing(tmp_path), resume="last")
    assert rest.steps == plain.steps and rest.pruned == plain.pruned
    assert rest.losses == plain.losses
    assert all(torch.equal(rest.state[k], plain.state[k]) for k in plain.state)


def test_the_evaluation_at_a_time_out_is_in_the_checkpoint_of_its_step(tmp_path):
    """Found by an outside audit: with a checkpoint every step, the one of the stopping
    step was written before the time-out evaluation and not again, so a resume with the
    same budget returned no metrics and no best."""
    val = data()[:2]
    ckpt = st.Checkpointing(tmp_path, every_steps=1, best=1)
    first = _tracked(3.5, ckpt).fit(graph(), data(), val)
    again = _tracked(3.5, ckpt).fit(graph(), data(), val, resume="last")
    assert first.metrics and again.metrics == first.metrics
    assert again.best == first.best is not None
    assert again.best_checkpoint == first.best_checkpoint == str(ckpt.file(4))
    assert st.load_checkpoint(first.checkpoint)["metrics"] == first.metrics


class Noisy(torch.utils.data.Dataset):
    """Validation rows with noise drawn from the global RNG as they are read."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(i)) + 0.1 * torch.randn(4), torch.zeros(1)


class DropTick(Tick):
    """``Tick`` with dropout in training: each step draws from the global RNG."""

    def forward(self, x, ctx):
        x = nn.functional.dropout(x, 0.5, training=ctx.training)
        return super().forward(x, ctx)


def test_the_evaluation_at_a_time_out_puts_the_rng_back(tmp_path):
    """Found by an outside audit: its draws moved the RNG the checkpoint then kept, so the
    dropout masks of a run resumed with a larger budget differed from one never stopped."""
    val = torch.utils.data.DataLoader(Noisy(), batch_size=4)

    def fit(max_time, ckpt, resume=None):
        torch.manual_seed(0)
        return trainer(max_time, ckpt=ckpt).fit(
            Graph.somatize(DropTick()), data(), val, resume=resume
        )

    plain = fit(None, None)
    assert fit(3.5, tmp_path).timed_out
    rest = fit(None, tmp_path, resume="last")
    assert rest.losses == plain.losses
