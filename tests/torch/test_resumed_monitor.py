"""A resumed run watches the metric its checkpoint's best, ranking and pruner state are of."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize.errors import CheckpointError
from somatize.torch import integrity

from .test_pruning import data as pruning_data
from .test_pruning import graph


def data(n: int = 3):
    return pruning_data(n)


def fit(tmp_path, epochs, monitor="val_loss", mode="min", pruner=None, val=True):
    """Two epochs, then ``epochs`` resumed; "score" is accuracy under a name that says no way."""
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        metrics={"acc": st.accuracy, "score": st.accuracy},
        checkpoint=st.Checkpointing(tmp_path / "ckpt", keep=1, best=1 if val else 0),
        pruner=pruner,
        options=st.Options(monitor=monitor, mode=mode, progress=False),
    ).fit(graph(), data(), val=data(1) if val else None, resume="last")


def test_the_checkpoint_records_its_monitor_and_mode_as_plain_data(tmp_path):
    fit(tmp_path, 2, "val_acc", "max", pruner=st.Patience("val_loss", mode="min"))
    last = st.Checkpointing(tmp_path / "ckpt").last()
    assert last is not None
    payload = st.load_checkpoint(last)  # weights_only=True
    assert (payload["monitor"], payload["mode"]) == ("val_acc", "max")
    assert payload["pruner"]["metric"] == "val_loss" and payload["pruner"]["mode"] == "min"
    plain = torch.load(last, weights_only=True)  # torch's own reader, with no allowlist
    assert (plain["monitor"], plain["pruner"]["mode"]) == ("val_acc", "min")


@pytest.mark.parametrize(
    ("monitor", "mode", "shown"),
    [
        ("val_acc", "max", "monitor='val_acc', mode='max'"),  # another metric
        ("val_score", "min", "monitor='val_score', mode='min'"),  # the same, the other way
    ],
)
def test_resuming_with_another_monitor_or_mode_is_refused(tmp_path, monitor, mode, shown):
    fit(tmp_path, 2, "val_score", "max")
    old = "monitor='val_score', mode='max'"
    with pytest.raises(
        CheckpointError,
        match=rf"written by a run with Options\({old}\), this Trainer has Options\({shown}\):"
        rf" its best \(val_score=[0-9.]+\).*resume with Options\({old}\), or start a fresh "
        r"run in another checkpoint directory",
    ):
        fit(tmp_path, 4, monitor, mode)
    # the same monitor resumes: best is of val_score, as an uninterrupted run's
    resumed = fit(tmp_path, 4, "val_score", "max")
    assert resumed.steps == 12 and resumed.best == max(m["val_score"] for m in resumed.metrics)


@pytest.mark.parametrize(
    ("pruner", "now"),
    [
        (st.Patience("val_acc", mode="max"), "Patience watches metric='val_acc', mode='max'"),
        (st.Patience("val_loss", mode="max"), "Patience watches metric='val_loss', mode='max'"),
    ],
)
def test_resuming_with_a_pruner_of_another_metric_or_mode_is_refused(tmp_path, pruner, now):
    fit(tmp_path, 2, pruner=st.Patience("val_loss", patience=5))
    with pytest.raises(
        CheckpointError,
        match=rf"pruner state is of metric='val_loss', mode='min', this run's {now}: .*"
        r"resume with Patience\('val_loss', mode='min'\), or start a fresh run",
    ):
        fit(tmp_path, 4, pruner=pruner)
    assert fit(tmp_path, 4, pruner=st.Patience("val_loss", patience=5)).steps == 12


def test_resuming_with_a_threshold_on_another_metric_is_refused(tmp_path):
    fit(tmp_path, 2, pruner=st.Threshold("val_loss", upper=100.0))
    with pytest.raises(
        CheckpointError,
        match=r"pruner state is of metric='val_loss', this run's Threshold watches "
        r"metric='val_acc'.*resume with Threshold\('val_loss'\)",
    ):
        fit(tmp_path, 4, pruner=st.Threshold("val_acc", lower=-1.0))


def test_resuming_with_another_kind_of_pruner_is_refused(tmp_path):
    fit(tmp_path, 2, pruner=st.Patience("val_loss", patience=5))
    with pytest.raises(
        CheckpointError,
        match=r"pruner state \(bad, best, metric, mode, reason\) is not a Threshold's "
        r"\(metric, reason, tripped\): .*resume with the pruner it was written with",
    ):
        fit(tmp_path, 4, pruner=st.Threshold("val_loss", upper=100.0))


def test_a_checkpoint_from_before_the_monitor_was_recorded_still_resumes(tmp_path):
    fit(tmp_path, 2, pruner=st.Patience("val_loss", patience=5))
    for path in (tmp_path / "ckpt").glob("step-*.ckpt"):  # as written before this change
        payload = st.load_checkpoint(path)
        del payload["monitor"], payload["mode"]
        del payload["pruner"]["metric"], payload["pruner"]["mode"]
        integrity.write_checkpoint(path, payload)
    # unchecked, as before: nothing says what its best is of
    pruner = st.Patience("val_acc", mode="max", patience=5)
    resumed = fit(tmp_path, 4, "val_acc", "max", pruner=pruner)
    assert resumed.steps == 12 and len(resumed.metrics) == 4


def test_a_checkpoint_without_an_evaluation_resumes_with_any_monitor(tmp_path):
    fit(tmp_path, 2, val=False)  # no best, no ranking: nothing to misread
    resumed = fit(tmp_path, 4, "val_acc", "max")
    assert resumed.steps == 12 and resumed.best == max(m["val_acc"] for m in resumed.metrics)
