"""Options(min_epochs=, min_steps=): early stopping cannot stop a run before them."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize.errors import SettingError
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer
from tests.torch.trainer_helpers import batches, make_graph, quiet


def frozen_lr(ps):
    return torch.optim.SGD(ps, lr=0.0)  # nothing improves: Patience runs out on schedule


class Answers:
    """A pruner answering from a list, one answer per evaluation; records what it is told."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.reported = answers, []

    def report(self, value: float, step: int) -> None:
        self.reported.append(step)

    def should_prune(self) -> bool:
        return self.answers[len(self.reported) - 1]


def fit(pruner, epochs=8, **options):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=frozen_lr,
        epochs=epochs,
        pruner=pruner,
        options=quiet(**options),
    ).fit(make_graph(), batches(2), val=batches(1))


def test_patience_stops_no_earlier_than_min_epochs():
    early = fit(st.Patience("val_loss", patience=1))
    assert early.pruned and early.epochs == 2  # the second evaluation does not improve
    floored = fit(st.Patience("val_loss", patience=1), min_epochs=5)
    assert floored.pruned and floored.epochs == 5  # still not improving when it may stop
    assert len(floored.metrics) == 5
    assert floored.losses[:4] == early.losses[:4]  # the floor changes nothing else


def test_a_stop_asked_before_the_floor_is_not_acted_on_and_the_pruner_is_asked_again():
    pruner = Answers([True, True, False, False, True, False, False, False])
    result = fit(pruner, min_epochs=3)
    assert result.pruned and result.epochs == 5  # the "yes" after epoch 3 was a "no"
    assert pruner.reported == [2, 4, 6, 8, 10]  # told of every evaluation
    never = fit(Answers([True, True, False, False, False, False, False, False]), min_epochs=3)
    assert not never.pruned and never.epochs == 8


def test_min_steps_floors_a_pruner_asked_every_few_steps():
    result = fit(st.Threshold("val_loss", upper=0.0), min_steps=5, eval_every_steps=2)
    assert result.pruned and result.steps == 6  # evaluations at 2, 4 ignored; 6 >= 5
    assert [m["step"] for m in result.metrics] == [2, 4, 6]


def test_the_floor_counts_an_epoch_as_ended_at_its_own_evaluation():
    result = fit(st.Threshold("val_loss", upper=0.0), min_epochs=1)
    assert result.pruned and result.epochs == 1  # stopped at the first epoch's end


@pytest.mark.parametrize(
    ("options", "trainer_kw", "match"),
    [
        ({"min_epochs": 9}, {"epochs": 8}, r"min_epochs=9\) is more than the Trainer's epochs=8"),
        ({"min_steps": 20}, {"max_steps": 10}, r"min_steps=20\) is more than.*max_steps=10"),
    ],
)
def test_a_floor_above_the_runs_end_is_refused_when_fit_starts(options, trainer_kw, match):
    t = st.Trainer(
        loss=F.cross_entropy, optimizer=frozen_lr, options=quiet(**options), **trainer_kw
    )
    with pytest.raises(SettingError, match=match):
        t.fit(make_graph(), batches(2))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"min_epochs": -1}, r"min_epochs must be at least 0"),
        ({"min_steps": 2.5}, r"min_steps must be a whole number"),
    ],
)
def test_bad_floors_are_refused_when_options_are_made(kw, match):
    with pytest.raises(SettingError, match=match):
        st.Options(**kw)


@pytest.mark.parametrize("crash_at", [6, 13])
def test_resume_under_a_floor_is_bitwise_identical(tmp_path, crash_at):
    def make(path, watchers=()):
        t = trainer(path, watchers=watchers)  # Patience that runs out at step 12
        t.options = st.Options(progress=False, eval_every_steps=4, min_epochs=3)
        return t

    reference = make(tmp_path / "ref").fit(graph(0), data(), val=data(2))
    assert reference.pruned and reference.steps == 16  # not 12: epoch 3 ends at step 15
    with pytest.raises(Crash):
        make(tmp_path, watchers=[CrashAt(crash_at)]).fit(graph(0), data(), val=data(2))
    resumed = make(tmp_path).fit(graph(5), data(), val=data(2), resume="last")
    assert_same(resumed, reference)
