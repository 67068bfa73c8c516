"""The TensorBoard watcher's event files as tensorboard itself serves them.

``served`` reads a folder with tensorboard's Python loader (``plugin_event_multiplexer``,
what ``tensorboard --load_fast=false`` and the HParams plugin read), which is stricter
than the legacy ``EventAccumulator``: it honours a ``SessionLog.START`` only after an
earlier one in the same run.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Graph
from somatize.watchers import StepEnd
from tests.torch.test_watchers_torch import Body, Head, data


class Crash(Exception):
    pass


class CrashAt:
    def __init__(self, step: int) -> None:
        self.step = step

    def on_event(self, event):
        if isinstance(event, StepEnd) and event.step == self.step:
            raise Crash


def served(log_dir, tag="train/loss"):
    """``(step, value)`` of ``tag`` in the run ``log_dir``, as tensorboard serves them."""
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.util import tensor_util

    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(log_dir))
    mux.Reload()
    return [
        (e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
        for e in mux.GetAccumulator(".").Tensors(tag)
    ]


def backdate(log_dir):
    """Date the folder's event files a second back: tensorboard reads them in name order
    (timestamp in seconds first), and a real restart comes in a later second."""
    for f in log_dir.iterdir():
        stamp = f.name.split(".")[3]
        f.rename(f.with_name(f.name.replace(stamp, str(int(stamp) - 1), 1)))


def trainer(tmp_path, *watchers, every_steps=None):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=3,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=every_steps),
        watchers=[st.TensorBoard(tmp_path / "tb"), *watchers],
        options=st.Options(progress=False),
    )


def graph():
    torch.manual_seed(0)
    return Graph.somatize(Body() >> Head())


def test_a_resumed_run_shows_each_step_once_as_tensorboard_serves_it(tmp_path):
    """Found by an outside audit: the interrupted run's file began with no START, so the
    Python loader took the resumed run's START for the first and hid nothing: steps 4 and 5
    were served twice (the legacy EventAccumulator, which the tests read, hid them)."""
    with pytest.raises(Crash):  # steps 1..5 logged, the checkpoint at step 3 (epoch 0's end)
        trainer(tmp_path, CrashAt(5)).fit(graph(), data())
    backdate(tmp_path / "tb")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a resumed run continues the curves: no warning
        result = trainer(tmp_path).fit(graph(), data(), resume="last")
    got = served(tmp_path / "tb")
    assert [s for s, _ in got] == list(range(1, 10))
    assert [v for _, v in got] == pytest.approx(result.losses)


def test_a_run_restarted_before_its_first_checkpoint_replaces_the_earlier_curves(tmp_path):
    """Found by an outside audit: killed before any checkpoint, ``resume="last"`` starts
    afresh (as documented), and tensorboard drew steps 1 and 2 twice; ``CSVLog`` replaces
    its file then, and TensorBoard now hides the earlier run's steps alike."""
    with pytest.raises(Crash):
        trainer(tmp_path, CrashAt(2)).fit(graph(), data())
    backdate(tmp_path / "tb")
    # (the same run starting over: no warning of an earlier run, FitStart.resuming)
    result = trainer(tmp_path).fit(graph(), data(), resume="last")
    got = served(tmp_path / "tb")
    assert [s for s, _ in got] == list(range(1, 10))
    assert [v for _, v in got] == pytest.approx(result.losses)
