"""``CSVLog(path, every_steps=N)``: every Nth step's row, as Lightning's ``log_every_n_steps``.

Found by a usability audit: ``TensorBoard`` and ``Progress`` took ``every_steps``, and the
CSV log wrote every step's row whatever the run's length.
"""

from __future__ import annotations

import pytest

import somatize.torch as st
from somatize.errors import SettingError
from tests.torch.test_checkpoint_resume import Crash, CrashAt, data, graph
from tests.torch.test_csvlog import rows
from tests.torch.test_watchers_torch import fit


def test_every_steps_writes_every_nth_steps_row_with_its_node_metrics(tmp_path):
    result = fit([st.CSVLog(tmp_path / "log.csv", every_steps=2)])
    got = rows(tmp_path / "log.csv")
    steps = [r for r in got if r["kind"] == "step"]
    assert [int(r["step"]) for r in steps] == [2, 4, 6]
    assert [float(r["loss"]) for r in steps] == pytest.approx(result.losses[1::2])
    assert all(r["head/logit_mean"] for r in steps)  # the node's metric, on its step's row
    assert [(r["kind"], int(r["step"])) for r in got if r["kind"] != "step"] == [
        ("eval", 3),  # evaluations and epochs: every one, whatever every_steps
        ("epoch", 3),
        ("eval", 6),
        ("epoch", 6),
    ]


def test_a_resumed_run_logging_every_n_steps_writes_each_row_once(tmp_path):
    from tests.torch.test_checkpoint_resume import trainer

    log = tmp_path / "log.csv"
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[st.CSVLog(log, every_steps=4), CrashAt(11)], pruner=None).fit(
            graph(0), data(), val=data(2)
        )
    trainer(tmp_path, watchers=[st.CSVLog(log, every_steps=4)], pruner=None).fit(
        graph(0), data(), val=data(2), resume="last"
    )
    steps = [int(r["step"]) for r in rows(log) if r["kind"] == "step"]
    assert steps == [4, 8, 12, 16, 20]


@pytest.mark.parametrize("every", [0, 2.5, True])
def test_a_bad_every_steps_is_refused_when_the_log_is_made(tmp_path, every):
    with pytest.raises(SettingError, match="CSVLog every_steps must be"):
        st.CSVLog(tmp_path / "log.csv", every_steps=every)
