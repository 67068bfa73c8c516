"""Pruners: the Trainer reports and asks; Patience, Threshold and any Optuna-like trial."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.errors import SettingError
from somatize.watchers import FitEnd


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Linear())


def data(n: int = 2):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


class FakeTrial:
    """Optuna's Trial as the Trainer sees it: report(value, step), should_prune()."""

    def __init__(self, prune_at: int) -> None:
        self.prune_at = prune_at
        self.reports: list[tuple[float, int]] = []
        self.asked = 0

    def report(self, value, step):
        self.reports.append((value, step))

    def should_prune(self):
        self.asked += 1
        return self.asked >= self.prune_at


def fit(pruner, lr=0.1, epochs=10, watchers=(), **options):
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
        epochs=epochs,
        metrics={"acc": st.accuracy},
        pruner=pruner,
        watchers=watchers,
        options=st.Options(progress=False, **options),
    )
    return trainer.fit(graph(), data(), val=data(1))


def test_a_fake_trial_is_asked_after_each_evaluation_and_stops_the_run():
    trial = FakeTrial(prune_at=3)
    assert isinstance(trial, st.Pruner)
    rec = Recorder()
    result = fit(trial, watchers=[rec], monitor="val_acc", mode="max")
    assert result.pruned
    assert (result.steps, result.epochs) == (6, 3)  # 2 batches an epoch, stopped after the 3rd
    assert trial.reports == [(m["val_acc"], m["step"]) for m in result.metrics]
    assert [step for _, step in trial.reports] == [2, 4, 6]
    assert trial.asked == 3
    assert rec.of(FitEnd)[0].pruned


def test_a_trial_that_never_prunes_lets_the_run_finish():
    trial = FakeTrial(prune_at=10**9)
    result = fit(trial, epochs=4)
    assert not result.pruned and result.steps == 8 and len(trial.reports) == 4


def test_pruning_between_epochs_with_eval_every_steps():
    trial = FakeTrial(prune_at=2)
    result = fit(trial, eval_every_steps=3)
    assert result.pruned and result.steps == 6 and [s for _, s in trial.reports] == [3, 6]


def test_patience_stops_when_the_metric_stalls():
    result = fit(st.Patience("val_loss", patience=2), lr=0.0)  # lr 0: val_loss never improves
    assert result.pruned
    assert len(result.metrics) == 3  # the first sets the best, then two without improvement
    improving = fit(st.Patience("val_loss", patience=2), lr=0.1, epochs=5)
    assert not improving.pruned and improving.epochs == 5


def test_patience_by_hand():
    p = st.Patience("val_acc", patience=2, mode="max", min_delta=0.05, check_finite=False)
    for v in [0.5, 0.52, 0.6, 0.61]:  # +0.02 and +0.01 are within min_delta
        p.report(v, 0)
    assert p.best == 0.6 and p.bad == 1 and not p.should_prune() and p.reason is None
    p.report(math.nan, 0)
    assert p.should_prune()  # NaN is never an improvement
    assert p.reason == "val_acc did not improve for 2 evaluations (best 0.6, min_delta 0.05)"
    q = st.Patience("val_acc", patience=2, mode="max")
    q.load_state_dict(p.state_dict())
    assert (q.best, q.bad, q.should_prune()) == (0.6, 2, True)
    old = st.Patience("val_acc", patience=2, mode="max")  # a checkpoint from before reason
    old.load_state_dict({"best": 0.6, "bad": 2})
    assert old.should_prune()
    with pytest.raises(ValueError, match="mode"):
        st.Patience(mode="up")


def test_patience_zero_stops_at_the_first_evaluation_that_does_not_improve():
    p = st.Patience("val_loss", patience=0)
    for step, v in enumerate([1.0, 0.9, 0.8]):  # improving: Lightning's EarlyStopping goes on
        p.report(v, step)
        assert not p.should_prune(), step
    p.report(0.85, 3)
    assert p.should_prune()
    # lr 0: the loss never improves, so the second evaluation stops the run (not the first)
    result = fit(st.Patience("val_loss", patience=0), lr=0.0)
    assert result.pruned and len(result.metrics) == 2


class Scripted:
    """A metric function giving the values of a script, one per evaluation (one batch)."""

    def __init__(self, values) -> None:
        self.values = iter(values)

    def __call__(self, out, y):
        return next(self.values)


def scripted(values, pruner):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=len(values),
        metrics={"score": Scripted(values)},
        pruner=pruner,
        options=st.Options(progress=False, sanity_val_batches=0),
    ).fit(graph(), data(), val=data(1))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_patience_stops_at_a_non_finite_value_as_lightnings_early_stopping(bad):
    # EarlyStopping("val_score", patience=2, min_delta=0.02) stops at the 3rd validation here
    values = [1.0, 0.9, bad, 0.8, 0.7, 0.6]
    result = scripted(values, st.Patience("val_score", patience=2, min_delta=0.02))
    assert result.pruned and len(result.metrics) == 3
    assert result.pruned_reason == f"val_score = {bad} at step 6 is not finite (best 0.9)"
    assert result.summary()["pruned_reason"] == result.pruned_reason
    # check_finite=False, as EarlyStopping(check_finite=False): NaN and inf are one more
    # evaluation that does not improve, so 0.8 resets the count and the run goes on; -inf
    # is a best under "min", that 0.8 and 0.7 do not improve on
    counting = scripted(values, st.Patience("val_score", patience=2, check_finite=False))
    assert counting.pruned == (bad == -math.inf)
    assert len(counting.metrics) == (5 if bad == -math.inf else 6)


def test_the_reason_of_a_stop_is_in_the_result():
    result = fit(st.Patience("val_loss", patience=1), lr=0.0)
    assert result.pruned_reason is not None
    assert result.pruned_reason.startswith("val_loss did not improve for 1 evaluation (best ")
    assert fit(st.Threshold("val_loss", upper=0.0)).pruned_reason.startswith(
        "val_loss = "
    )  # "... at step 2 is above 0"
    assert fit(FakeTrial(prune_at=1)).pruned_reason == "pruned by FakeTrial"
    assert fit(st.Patience("val_loss", patience=2), epochs=1).pruned_reason is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"check_finite": "yes"}, "Patience check_finite must be True or False, not 'yes'"),
        ({"patience": -1}, "Patience patience must be at least 0, not -1"),
        ({"patience": 1.5}, r"Patience patience must be a whole number, not 1.5"),
        ({"patience": True}, "Patience patience must be a whole number, not True"),
        ({"min_delta": -0.1}, "Patience min_delta must be a finite number >= 0, not -0.1"),
        ({"min_delta": math.inf}, "min_delta must be a finite number >= 0, not inf"),
        ({"min_delta": math.nan}, "min_delta must be a finite number >= 0, not nan"),
        ({"min_delta": "0.1"}, "min_delta must be a finite number >= 0, not '0.1'"),
    ],
)
def test_bad_patience_settings_are_refused(kwargs, match):
    with pytest.raises(SettingError, match=match):
        st.Patience("val_loss", **kwargs)


def test_a_default_min_patience_on_a_max_monitor_is_refused_at_fit_start():
    with pytest.raises(
        SettingError,
        match=r"Patience\('val_acc'\) .* defaults to 'min'.*Options\(monitor='val_acc', "
        r"mode='max'\).*pass Patience\('val_acc', mode='max'\)",
    ):
        with pytest.warns(UserWarning, match="default 'min'"):  # warned when made, too
            pruner = st.Patience("val_acc")
        fit(pruner, monitor="val_acc", mode="max")
    # said explicitly, either way, it is kept; on another metric it is not compared
    assert fit(st.Patience("val_acc", mode="max"), epochs=2, monitor="val_acc", mode="max")
    assert fit(st.Patience("val_acc", mode="min"), epochs=2, monitor="val_acc", mode="max")
    assert fit(st.Patience("val_loss"), epochs=2, monitor="val_acc", mode="max")


@pytest.mark.parametrize("metric", ["val_acc", "val_f1", "val_head/AUC"])
def test_a_default_min_patience_on_a_rising_metric_warns_by_its_name(metric):
    shown = re.escape(metric)
    with pytest.warns(
        UserWarning,
        match=rf"Patience\('{shown}'\) leaves mode at its default 'min', but the name says "
        rf"{shown} improves by rising: the run would stop while it improves.*pass "
        rf"Patience\('{shown}', mode='max'\)",
    ) as caught:
        p = st.Patience(metric, patience=1)
    assert caught[0].filename == __file__  # points at the line that made it
    for step, v in enumerate([0.5, 0.6]):  # what it warns of: rising, it "did not improve"
        p.report(v, step)
    assert p.should_prune() and p.reason is not None and "did not improve" in p.reason


def test_a_patience_mode_said_or_a_name_that_does_not_rise_does_not_warn():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        st.Patience("val_acc", mode="max")
        st.Patience("val_acc", mode="min")  # said explicitly: kept, as fit() keeps it
        st.Patience("val_loss")
        st.Patience("val_score")  # the name does not say which way
        st.Threshold("val_acc", lower=0.1)  # no mode: its bounds say which way is worse
    assert caught == []


def test_a_threshold_without_a_bound_says_how_to_give_one():
    with pytest.raises(
        ValueError, match=r"Threshold\('val_acc'\) needs .*st\.Threshold\('val_acc', upper="
    ):
        st.Threshold("val_acc")


def test_threshold_prunes_past_a_bound_or_on_nan():
    assert fit(st.Threshold("val_loss", upper=0.0)).pruned  # any loss is above 0
    result = fit(st.Threshold("val_acc", lower=-1.0), epochs=3)
    assert not result.pruned and result.epochs == 3
    t = st.Threshold("val_loss", upper=10.0)
    t.report(1.0, 1)
    assert not t.should_prune()
    t.report(math.nan, 2)
    assert t.should_prune()
    u = st.Threshold("val_loss", upper=10.0)
    u.load_state_dict(t.state_dict())
    assert u.should_prune()
    with pytest.raises(ValueError, match="bound"):
        st.Threshold("val_loss")


def test_a_pruner_watching_a_metric_that_is_not_evaluated_names_it():
    with pytest.raises(KeyError, match=r"val_f1.*val_loss, val_acc"):
        fit(st.Patience("val_f1", mode="max"))


def test_optuna_trial_fits_as_it_is():
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=0.0))
    trial = study.ask()
    result = fit(trial)
    assert result.pruned and len(result.metrics) == 1
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {
        result.metrics[0]["step"]: result.metrics[0]["val_loss"]
    }
