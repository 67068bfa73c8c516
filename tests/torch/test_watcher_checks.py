"""Watchers misused are refused when made or at the first event that shows it, naming the
fix: a log path of the wrong kind, a bad TensorBoard interval, a watcher class, a node's
training metrics that are not numbers; and a watcher whose close() fails never hides the
fit's own error nor leaves the other watchers open."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.errors import NonFiniteError, SettingError
from somatize.watchers import Metrics

from .trainer_helpers import batches, make_graph, quiet, sgd


def trainer(watchers, **kw) -> st.Trainer:
    return st.Trainer(loss=F.cross_entropy, optimizer=sgd, watchers=watchers, options=quiet(), **kw)


def test_log_paths_of_the_wrong_kind_are_refused_when_made(tmp_path):
    # before: at fit, an IsADirectoryError naming a temp file, and a bare FileExistsError
    with pytest.raises(
        IsADirectoryError, match=r"CSVLog takes the path of a CSV file.*metrics\.csv"
    ):
        st.CSVLog(tmp_path)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(NotADirectoryError, match=r"TensorBoard takes a directory.*is a file"):
        st.TensorBoard(a_file)


@pytest.mark.parametrize("every", [0, -1, 2.5, "2", None])
def test_tensorboard_every_steps_is_a_whole_number_of_at_least_one(tmp_path, every):
    # before: 0 a ZeroDivisionError at step 1, 2.5 logged no step at all, -1 accepted
    with pytest.raises(SettingError, match="TensorBoard every_steps must be"):
        st.TensorBoard(tmp_path / "tb", every_steps=every)


@pytest.mark.parametrize("cls", [st.Progress, st.CSVLog, Recorder])
def test_a_watcher_class_is_refused_asking_for_an_instance(cls):
    # before: accepted, then "on_event() missing 1 required positional argument" at step 1
    with pytest.raises(
        SettingError, match=rf"{cls.__qualname__} is a watcher class, not a watcher"
    ):
        trainer([cls])


class Reports(Node):
    def __init__(self, metrics) -> None:
        self.lin = torch.nn.Linear(4, 3)
        self.metrics = metrics

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)), metrics=self.metrics)


@pytest.mark.parametrize(
    "metrics",
    [{"note": "hi"}, {"spread": torch.ones(3)}, {"n": None}, [1.0], 3.0],
    ids=["string", "vector", "none", "list", "float"],
)
def test_a_nodes_training_metrics_that_are_not_numbers_name_the_node(tmp_path, metrics):
    # before: a ValueError from TensorBoard's float() or an AttributeError, naming neither
    g = Graph.somatize(Reports(metrics).with_id("enc"))
    with pytest.raises(TypeError, match=r"node 'enc'"):
        trainer([st.TensorBoard(tmp_path / "tb")]).fit(g, batches(2))


def test_a_nodes_training_metrics_reach_watchers_as_numbers():
    rec = Recorder()
    g = Graph.somatize(Reports({"mean": torch.tensor(0.25), "n": 3}).with_id("enc"))
    trainer([rec]).fit(g, batches(2))
    values = [e.values for e in rec.events if isinstance(e, Metrics) and e.node == "enc"]
    assert values == [{"mean": 0.25, "n": 3.0}] * 2  # (before: 0-d tensors, "Scalars")
    assert all(type(v) is float for vs in values for v in vs.values())


class Closes:
    def __init__(self, fails: bool) -> None:
        self.fails, self.closed = fails, False

    def on_event(self, event) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        if self.fails:
            raise OSError("disk full while flushing")


def nan_loss(output, target):
    return F.cross_entropy(output, target) * math.nan


def test_a_watcher_failing_to_close_is_a_note_on_the_fits_own_error():
    # before: the watcher's OSError in its place, and the watchers after it left open
    first, after = Closes(fails=True), Closes(fails=False)
    t = st.Trainer(loss=nan_loss, optimizer=sgd, watchers=[first, after], options=quiet())
    with pytest.raises(NonFiniteError) as e:
        t.fit(make_graph(), batches(2))
    assert first.closed and after.closed
    assert any("disk full while flushing" in n for n in e.value.__notes__)


def test_a_watcher_failing_to_close_after_a_good_fit_raises_once_all_are_closed():
    first, after = Closes(fails=True), Closes(fails=False)
    with pytest.raises(OSError, match="disk full while flushing"):
        trainer([first, after]).fit(make_graph(), batches(2))
    assert after.closed


@pytest.mark.parametrize("interval", ["x", -1, None])
def test_progress_interval_is_a_number_of_seconds(interval):
    with pytest.raises(SettingError, match="Progress interval is the shortest time"):
        st.Progress(interval=interval)


def test_progress_refuses_a_binary_stream():
    import io

    # before: accepted, then "a bytes-like object is required" mid-fit
    with pytest.raises(TypeError, match="Progress draws text.*not sys.stdout.buffer"):
        st.Progress(io.BytesIO())
