"""``st.TensorBoard.writer`` (what the watcher does not write: images, histograms — the
run folder's ``SummaryWriter``) and the epoch's ``time/data`` and ``time/steps``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.watchers import EpochEnd, FitStart
from tests.torch.test_tensorboard import Crash, CrashAt, backdate, graph, served
from tests.torch.test_watchers_torch import data


def fit(tb, *watchers, resume=None, ckpt=None, epochs=3):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        checkpoint=None if ckpt is None else st.Checkpointing(ckpt),
        watchers=[tb, *watchers],
        options=st.Options(progress=False),
    ).fit(graph(), data(), resume=resume)


class Extra:
    """A watcher of the user's, after the TensorBoard one, writing through its writer."""

    def __init__(self, tb):
        self.tb = tb

    def on_event(self, event):
        if isinstance(event, EpochEnd):
            self.tb.writer.add_scalar("extra/epoch_x10", 10.0 * (event.epoch + 1), event.step)


def test_a_watcher_of_yours_writes_through_the_runs_writer_at_the_trainers_steps(tmp_path):
    tb, recorder = st.TensorBoard(tmp_path / "tb"), Recorder()
    result = fit(tb, Extra(tb), recorder)
    ends = recorder.of(EpochEnd)
    assert served(tmp_path / "tb", "extra/epoch_x10") == [
        (e.step, 10.0 * (e.epoch + 1)) for e in ends
    ]
    assert [s for s, _ in served(tmp_path / "tb")] == list(range(1, result.steps + 1))
    assert len(list((tmp_path / "tb").iterdir())) == 1  # one event file: the fit's own writer


def test_the_writer_after_a_fit_appends_and_hides_none_of_its_steps(tmp_path):
    """A fit's writer starts with a START (tensorboard hides the folder's earlier steps from
    there on); one opened after the fit must not, or the run's curves would vanish."""
    tb = st.TensorBoard(tmp_path / "tb")
    result = fit(tb)
    backdate(tmp_path / "tb")  # (the later file comes in a later second, as in real use)
    tb.writer.add_scalar("test/acc", 0.75, result.steps)
    tb.close()
    assert [s for s, _ in served(tmp_path / "tb")] == list(range(1, result.steps + 1))
    assert served(tmp_path / "tb", "test/acc") == [(result.steps, 0.75)]


def test_the_writer_used_before_a_resumed_fit_still_hides_the_steps_it_supersedes(tmp_path):
    with pytest.raises(Crash):  # steps 1..5 logged, the checkpoint at step 3 (epoch 0's end)
        fit(st.TensorBoard(tmp_path / "tb"), CrashAt(5), ckpt=tmp_path / "ckpt")
    backdate(tmp_path / "tb")
    tb = st.TensorBoard(tmp_path / "tb")
    tb.writer.add_scalar("setup/width", 16.0, 0)  # before the fit: a writer of its own
    result = fit(tb, resume="last", ckpt=tmp_path / "ckpt")
    got = served(tmp_path / "tb")
    assert [s for s, _ in got] == list(range(1, 10))  # 4 and 5 once: the fit's START
    assert [v for _, v in got] == pytest.approx(result.losses)
    assert served(tmp_path / "tb", "setup/width") == [(0, 16.0)]


def test_each_epoch_writes_where_its_time_went(tmp_path):
    recorder = Recorder()
    fit(st.TensorBoard(tmp_path / "tb"), recorder, epochs=2)
    ends = recorder.of(EpochEnd)
    assert all(e.steps > 0 for e in ends)
    for tag, of in (("time/data", lambda e: e.data), ("time/steps", lambda e: e.steps)):
        assert served(tmp_path / "tb", tag) == [(e.step, pytest.approx(of(e))) for e in ends]


class AtStart:
    """A watcher of the user's listed *before* the TensorBoard one, writing at ``FitStart``
    (the watcher has not seen it yet: the writer it gets is one opened outside the fit)."""

    def __init__(self, tb):
        self.tb = tb

    def on_event(self, event):
        if isinstance(event, FitStart):
            self.tb.writer.add_scalar("setup/at_start", 1.0, 0)


@pytest.mark.parametrize("where", ["before the fit", "a watcher listed before"])
def test_the_writer_used_before_a_fresh_fit_is_not_an_earlier_run(tmp_path, where):
    """Found trying the feature as a user: a fresh fit into a folder that held only what
    ``tb.writer`` wrote before it (a config, a sample of the data, at step 0) warned that
    the folder "already holds the event files of an earlier run"."""
    tb = st.TensorBoard(tmp_path / "tb")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning of an earlier run
        if where == "before the fit":
            tb.writer.add_scalar("setup/at_start", 1.0, 0)
            result = fit(tb, epochs=1)
        else:
            result = st.Trainer(
                loss=F.cross_entropy,
                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                epochs=1,
                watchers=[AtStart(tb), tb],
                options=st.Options(progress=False),
            ).fit(graph(), data())
    tb.close()
    assert served(tmp_path / "tb", "setup/at_start") == [(0, 1.0)]
    assert [s for s, _ in served(tmp_path / "tb")] == list(range(1, result.steps + 1))


def test_the_writer_used_before_a_fresh_fit_into_an_earlier_runs_folder_still_warns(tmp_path):
    fit(st.TensorBoard(tmp_path / "tb"), epochs=1)  # an earlier run's files
    backdate(tmp_path / "tb")
    tb = st.TensorBoard(tmp_path / "tb")
    tb.writer.add_scalar("setup/at_start", 1.0, 0)
    with pytest.warns(RuntimeWarning, match="already holds the event files of an earlier run"):
        fit(tb, epochs=1)
