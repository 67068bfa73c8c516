"""An Optuna trial as the pruner: the value the Trainer reports must improve the way the
study optimizes, or its pruner prunes the best trials and keeps the worst."""

from __future__ import annotations

import enum

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data(n: int = 2):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def fit(pruner, **options):
    torch.manual_seed(0)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        metrics={"acc": st.accuracy},
        pruner=pruner,
        options=st.Options(progress=False, **options),
    )
    return trainer.fit(Graph.somatize(Linear()), data(), val=data(1))


class Direction(enum.Enum):  # optuna.study.StudyDirection's shape
    NOT_SET = 0
    MINIMIZE = 1
    MAXIMIZE = 2


class FakeStudy:
    def __init__(self, *directions: Direction) -> None:
        self.directions = list(directions)


class FakeTrial:
    """An Optuna Trial as the Trainer sees it: report, should_prune, and its study."""

    def __init__(self, study: FakeStudy) -> None:
        self.study = study
        self.reports: list[tuple[float, int]] = []

    def report(self, value, step):
        self.reports.append((value, step))

    def should_prune(self):
        return False


def test_a_maximizing_study_told_the_default_val_loss_is_refused():
    trial = FakeTrial(FakeStudy(Direction.MAXIMIZE))
    with pytest.raises(SettingError) as e:
        fit(trial)
    message = str(e.value)
    assert "maximize" in message and "val_loss" in message
    assert "Options(monitor=" in message and "mode='max'" in message
    assert trial.reports == []  # refused before any step


def test_a_minimizing_study_told_an_accuracy_is_refused():
    with pytest.raises(SettingError, match=r"minimize.*val_acc"):
        fit(FakeTrial(FakeStudy(Direction.MINIMIZE)), monitor="val_acc", mode="max")


def test_matching_directions_and_studies_that_do_not_say_are_left_alone():
    assert not fit(FakeTrial(FakeStudy(Direction.MAXIMIZE)), monitor="val_acc", mode="max").pruned
    assert not fit(FakeTrial(FakeStudy(Direction.MINIMIZE))).pruned
    for study in (FakeStudy(Direction.NOT_SET), FakeStudy(), FakeStudy(*Direction)):
        trial = FakeTrial(study)
        fit(trial)
        assert len(trial.reports) == 2


def test_a_real_optuna_study_in_the_wrong_direction_is_refused():
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner())
    with pytest.raises(SettingError, match="maximize"):
        fit(study.ask())
    trial = study.ask()
    fit(trial, monitor="val_acc", mode="max")
    assert len(trial.storage.get_trial(trial._trial_id).intermediate_values) == 2


def test_a_trial_given_to_a_second_fit_is_refused_naming_the_fix():
    # the next seed of a configuration, fitted with the same trial: Optuna would ignore
    # its reports (steps already reported) and prune it by the first seed's values
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner())
    trial = study.ask()
    fit(trial, monitor="val_acc", mode="max")
    held = dict(trial.storage.get_trial(trial._trial_id).intermediate_values)
    with pytest.raises(SettingError, match=r"Trial 0 already holds .* pruner=None for the others"):
        fit(trial, monitor="val_acc", mode="max")
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == held
    fit(None, monitor="val_acc", mode="max")  # the other seeds, without the trial: fine
    fresh = study.ask()
    fit(fresh, monitor="val_acc", mode="max")
    assert len(fresh.storage.get_trial(fresh._trial_id).intermediate_values) == 2
