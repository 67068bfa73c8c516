"""Options(eval_every_epochs=N): Lightning's check_val_every_n_epoch, next to eval_every_steps."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.errors import SettingError
from somatize.watchers import EpochEnd, Metrics
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer
from tests.torch.trainer_helpers import batches, make_graph, quiet, sgd


def test_evaluations_come_at_the_end_of_every_nth_epoch_only():
    rec = Recorder()
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=5,
        metrics={"acc": st.accuracy},
        watchers=[rec],
        options=quiet(eval_every_epochs=2),
    ).fit(make_graph(), batches(3), val=batches(2))
    # epochs 2 and 4 (counted from 1), none after the 5th — as Lightning does
    assert [(m["step"], m["epoch"]) for m in result.metrics] == [(6, 1), (12, 3)]
    assert [bool(e.metrics) for e in rec.of(EpochEnd)] == [False, True, False, True, False]
    assert [e.step for e in rec.of(Metrics) if e.node == ""] == [6, 12]
    assert result.best == min(m["val_loss"] for m in result.metrics)


def test_evaluating_every_epoch_is_the_default_and_changes_no_step():
    def fit(**kw):
        return st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=3, options=quiet(**kw)).fit(
            make_graph(), batches(3), val=batches(2)
        )

    every, default, third = fit(eval_every_epochs=1), fit(), fit(eval_every_epochs=3)
    assert every.metrics == default.metrics and len(default.metrics) == 3
    assert [m["epoch"] for m in third.metrics] == [2]
    assert third.metrics[0] == default.metrics[2]  # evaluating does not change training
    assert third.losses == default.losses


def test_a_pruner_is_asked_only_at_the_scheduled_evaluations():
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.0),  # nothing improves
        epochs=9,
        pruner=st.Patience("val_loss", patience=1),
        options=quiet(eval_every_epochs=3),
    ).fit(make_graph(), batches(2), val=batches(1))
    assert result.pruned and result.epochs == 6  # asked after epochs 3 and 6
    assert [m["epoch"] for m in result.metrics] == [2, 5]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"eval_every_steps": 5, "eval_every_epochs": 2},
            r"eval_every_steps=5, eval_every_epochs=2\) asks for two evaluation schedules.*"
            r"pass one of them",
        ),
        ({"eval_every_steps": 5, "eval_every_epochs": 1}, r"two evaluation schedules"),
        ({"eval_every_epochs": 0}, r"eval_every_epochs must be at least 1, not 0"),
        ({"eval_every_epochs": 1.5}, r"eval_every_epochs must be a whole number"),
    ],
)
def test_conflicting_or_bad_schedules_are_refused_when_options_are_made(kw, match):
    with pytest.raises(SettingError, match=match):
        st.Options(**kw)


def test_a_schedule_that_never_evaluates_is_refused_when_fit_starts():
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, epochs=3, options=quiet(eval_every_epochs=4)
    )
    with pytest.raises(SettingError, match=r"trains 3 epochs, so val= would never be evaluated"):
        trainer.fit(make_graph(), batches(2), val=batches(1))
    assert trainer.fit(make_graph(), batches(2)).epochs == 3  # without val= it trains


def test_the_fast_path_and_the_general_one_evaluate_alike():
    class Silent:
        def on_event(self, event) -> None:
            pass

    results = [
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=sgd,
            epochs=4,
            watchers=watchers,
            options=quiet(eval_every_epochs=2),
        ).fit(make_graph(), batches(3), val=batches(2))
        for watchers in ([], [Silent()])
    ]
    assert results[0].metrics == results[1].metrics and len(results[0].metrics) == 2
    assert results[0].losses == results[1].losses


@pytest.mark.parametrize("crash_at", [7, 10])
def test_resume_with_an_epoch_schedule_is_bitwise_identical(tmp_path, crash_at):
    def make(path, watchers=()):
        t = trainer(path, watchers=watchers, pruner=None)
        t.options = st.Options(progress=False, eval_every_epochs=2)
        return t

    reference = make(tmp_path / "ref").fit(graph(0), data(), val=data(2))
    assert [m["epoch"] for m in reference.metrics] == [1, 3]
    with pytest.raises(Crash):
        make(tmp_path, watchers=[CrashAt(crash_at)]).fit(graph(0), data(), val=data(2))
    resumed = make(tmp_path).fit(graph(5), data(), val=data(2), resume="last")
    assert_same(resumed, reference)


@pytest.mark.parametrize(("kw", "steps"), [({"epochs": 2}, 8), ({"epochs": 5, "max_steps": 6}, 6)])
def test_eval_every_steps_beyond_the_runs_steps_is_refused_before_any_step(kw, steps):
    g = make_graph()
    before = {k: v.clone() for k, v in st.module(g).state_dict().items()}
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        pruner=st.Patience("val_loss", patience=1),
        options=quiet(eval_every_steps=steps + 1),
        **kw,
    )
    with pytest.raises(
        SettingError,
        match=rf"eval_every_steps={steps + 1}\) evaluates after step {steps + 1}.*takes {steps} "
        rf"optimizer steps.*never be evaluated.*eval_every_steps <= {steps}",
    ):
        trainer.fit(g, batches(4), val=batches(1))
    assert all(torch.equal(v, st.module(g).state_dict()[k]) for k, v in before.items())
    trainer.options = quiet(eval_every_steps=steps)  # the last step evaluates
    assert len(trainer.fit(g, batches(4), val=batches(1)).metrics) == 1
