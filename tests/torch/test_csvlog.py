"""The CSV watcher: one row per step and evaluation, read by pandas."""

from __future__ import annotations

import csv
import multiprocessing
import os
import signal

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.watchers import EpochEnd, FitStart, StepEnd
from tests.torch.test_checkpoint import Unsized
from tests.torch.test_checkpoint_resume import Crash, CrashAt, data, graph
from tests.torch.test_watchers_torch import Body, Head, fit
from tests.torch.test_watchers_torch import data as wdata


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_one_row_per_step_and_evaluation_with_node_metrics(tmp_path):
    result = fit([st.CSVLog(tmp_path / "log.csv")])
    got = rows(tmp_path / "log.csv")
    steps = [r for r in got if r["kind"] == "step"]
    evals = [r for r in got if r["kind"] == "eval"]
    assert [int(r["step"]) for r in steps] == list(range(1, 7))
    assert [float(r["loss"]) for r in steps] == pytest.approx(result.losses)
    assert [float(r["lr"]) for r in steps] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert all(r["head/logit_mean"] for r in steps)  # the node's metric, on its step's row
    assert [(int(r["step"]), int(r["epoch"])) for r in evals] == [(3, 0), (6, 1)]
    assert [float(r["val_acc"]) for r in evals] == pytest.approx(
        [m["val_acc"] for m in result.metrics]
    )
    assert [float(r["val_head/logit_mean"]) for r in evals] == pytest.approx(
        [m["val_head/logit_mean"] for m in result.metrics]
    )
    assert got[0]["val_loss"] == ""  # steps before the first evaluation: blank, not missing


def test_pandas_reads_it():
    pd = pytest.importorskip("pandas")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        fit([st.CSVLog(Path(d) / "log.csv")])
        frame = pd.read_csv(Path(d) / "log.csv")
    assert len(frame) == 10 and frame.query("kind == 'eval'")["val_loss"].notna().all()
    epochs = frame.query("kind == 'epoch'")  # each epoch's mean loss, in a column of its own
    assert epochs["epoch_loss"].notna().all() and epochs["loss"].isna().all()


def test_a_resumed_run_drops_the_rows_after_its_checkpoint(tmp_path):
    from tests.torch.test_checkpoint_resume import trainer

    log = tmp_path / "log.csv"
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[st.CSVLog(log), CrashAt(7)], pruner=None).fit(
            graph(0), data(), val=data(2)
        )
    assert max(int(r["step"]) for r in rows(log)) == 7
    trainer(tmp_path, watchers=[st.CSVLog(log)], pruner=None).fit(
        graph(0), data(), val=data(2), resume="last"
    )
    steps = [int(r["step"]) for r in rows(log) if r["kind"] == "step"]
    assert steps == list(range(1, 21))  # 7 was dropped (the checkpoint is at 6), then written again


def test_the_gradient_norm_is_a_column_only_when_told(tmp_path):
    fit([st.CSVLog(tmp_path / "plain.csv")])
    assert "grad_norm" not in rows(tmp_path / "plain.csv")[0]  # a default log is as before
    recorder = Recorder()
    fit([st.CSVLog(tmp_path / "log.csv"), recorder], log_grad_norm=True)
    steps = [r for r in rows(tmp_path / "log.csv") if r["kind"] == "step"]
    assert [float(r["grad_norm"]) for r in steps] == [e.grad_norm for e in recorder.of(StepEnd)]


def test_a_log_without_the_norm_resumes_with_it_its_earlier_rows_blank(tmp_path):
    from tests.torch.test_checkpoint_resume import trainer

    log = tmp_path / "log.csv"
    with pytest.raises(Crash):  # a log written before the norm was told (an older run)
        trainer(tmp_path, watchers=[st.CSVLog(log), CrashAt(7)], pruner=None).fit(
            graph(0), data(), val=data(2)
        )
    assert "grad_norm" not in rows(log)[0]
    # (log_grad_norm changes nothing the run computes: turned on at a resume, it is silent)
    trainer(tmp_path, watchers=[st.CSVLog(log)], pruner=None, log_grad_norm=True).fit(
        graph(0), data(), val=data(2), resume="last"
    )
    steps = [r for r in rows(log) if r["kind"] == "step"]
    assert [int(r["step"]) for r in steps] == list(range(1, 21))
    assert [r["grad_norm"] for r in steps[:6]] == [""] * 6  # up to the checkpoint: none told
    assert all(float(r["grad_norm"]) > 0 for r in steps[6:])
    assert all(r["loss"] for r in steps)  # the old rows kept their values


class DieAtEpochEnd:
    """The process dying after epoch 0's evaluation, before its end-of-epoch checkpoint."""

    def on_event(self, event) -> None:
        if isinstance(event, EpochEnd) and event.epoch == 0:
            raise Crash


@pytest.mark.parametrize("sized", [True, False], ids=["list", "unsized"])
@pytest.mark.parametrize("cached", [False, True], ids=["plain", "cached"])
def test_an_evaluation_after_the_checkpoint_of_its_step_is_logged_once_after_a_resume(
    tmp_path, cached, sized
):
    """Found by an outside audit: with a checkpoint at an epoch's last step, a run that died
    after that epoch's evaluation logged it twice once resumed (it evaluates again), and
    the epoch's cache row too. A list's epoch end is known at step 4, whose checkpoint
    comes after the epoch's end (which the run dies in): it resumes from step 2, and the
    rows after it go. Data without a length checkpoints step 4 before its epoch's end is
    known, so the resumed run starts at step 4 without that evaluation
    (``FitStart.start_evaluated`` False): its evaluation and epoch rows at step 4 go."""

    def model():
        g = graph(0)
        return g.freeze("body").cache("body", per="example") if cached else g

    def fit(folder, extra=(), resume=None):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            checkpoint=st.Checkpointing(tmp_path / folder / "ckpt", every_steps=2),
            watchers=[st.CSVLog(tmp_path / folder / "log.csv"), *extra],
            options=st.Options(progress=False),
        ).fit(model(), train(), val=data(2), resume=resume)  # 4 batches: step 4 ends epoch 0

    def train():
        return data(4) if sized else Unsized(data(4))

    fit("ref")
    with pytest.raises(Crash):
        fit("run", [DieAtEpochEnd()])
    recorder = Recorder()
    fit("run", [recorder], resume="last")
    (start,) = recorder.of(FitStart)
    assert (start.start_step, start.start_evaluated) == ((2, False) if sized else (4, False))
    kinds = [(r["kind"], r["step"]) for r in rows(tmp_path / "run" / "log.csv")]
    assert kinds == [(r["kind"], r["step"]) for r in rows(tmp_path / "ref" / "log.csv")]
    assert kinds.count(("eval", "4")) == 1
    assert kinds.count(("epoch", "4")) == 1  # (its mean loss, and the cache's counts)


def test_the_csv_log_pickles_without_its_file(tmp_path):
    import pickle

    log = st.CSVLog(tmp_path / "log.csv")
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[log],
        options=st.Options(progress=False),
    ).fit(__import__("somatize").Graph.somatize(Body() >> Head()), wdata())
    assert pickle.loads(pickle.dumps(log)).path == log.path


class KillAt:
    """SIGKILLs the process as step ``step`` ends: no close(), nothing flushed on the way."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_event(self, event) -> None:
        from somatize.watchers import StepEnd

        if isinstance(event, StepEnd) and event.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def _killed_fit(tmp_path, kill_at: int) -> None:
    from tests.torch.test_checkpoint_resume import trainer

    torch.set_num_threads(1)
    log = st.CSVLog(tmp_path / "log.csv")
    trainer(tmp_path, watchers=[KillAt(kill_at), log], pruner=None).fit(
        graph(0), data(), val=data(2)
    )


@pytest.mark.parametrize("kill_at", [7, 11])  # after checkpoint 6 (mid-epoch), 10 (epoch end)
def test_a_kill_after_a_checkpoint_loses_no_row_it_covers(tmp_path, kill_at):
    from tests.torch.test_checkpoint_resume import trainer

    child = multiprocessing.get_context("fork").Process(
        target=_killed_fit, args=(tmp_path, kill_at)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    checkpointed = kill_at - 1
    assert max(int(r["step"]) for r in rows(tmp_path / "log.csv")) == checkpointed
    trainer(tmp_path, watchers=[st.CSVLog(tmp_path / "log.csv")], pruner=None).fit(
        graph(0), data(), val=data(2), resume="last"
    )
    steps = [int(r["step"]) for r in rows(tmp_path / "log.csv") if r["kind"] == "step"]
    assert steps == list(range(1, 21))


@pytest.mark.parametrize("damage", [b"2x", b"\0"])
def test_a_damaged_row_is_dropped_with_a_warning_and_the_resume_goes_on(tmp_path, damage):
    from tests.torch.test_checkpoint_resume import trainer

    log = tmp_path / "log.csv"
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[st.CSVLog(log), CrashAt(7)], pruner=None).fit(
            graph(0), data(), val=data(2)
        )
    lines = log.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"step,2,", b"step," + damage + b",", 1)  # row of step 2
    log.write_bytes(b"\n".join(lines))
    with pytest.warns(UserWarning, match=r"damaged row.*log.csv"):
        trainer(tmp_path, watchers=[st.CSVLog(log)], pruner=None).fit(
            graph(0), data(), val=data(2), resume="last"
        )
    steps = [r["step"] for r in rows(log) if r["kind"] == "step"]
    assert steps == [str(n) for n in range(1, 21) if n != 2]


@pytest.mark.parametrize("cut", [len("step,1"), len("step,13,2,0.")])
def test_a_row_torn_by_a_kill_is_never_read_as_a_row_on_resume(tmp_path, cut):
    """Found by an outside audit: the row a kill tore (no newline at its end) was read as
    a whole one. Cut inside its step, "step,1" of step 13's row is a row of step 1, before
    the checkpoint (12): kept, a step logged twice, its values blank."""
    from tests.torch.test_checkpoint_resume import trainer

    log = tmp_path / "log.csv"
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[st.CSVLog(log), CrashAt(13)], pruner=None).fit(
            graph(0), data(), val=data(2)
        )
    text = log.read_bytes()
    last = text.rindex(b"\nstep,13,") + 1
    log.write_bytes(text[: last + cut])  # killed while writing step 13's row
    trainer(tmp_path, watchers=[st.CSVLog(log)], pruner=None).fit(
        graph(0), data(), val=data(2), resume="last"
    )
    steps = [int(r["step"]) for r in rows(log) if r["kind"] == "step"]
    assert steps == list(range(1, 21))
    assert all(r["loss"] for r in rows(log) if r["kind"] == "step")


def test_a_short_write_is_an_error_and_leaves_no_torn_row(tmp_path, monkeypatch):
    """A row the disk took only part of (full) is cut off again: the next row is not
    joined to it, and a reader never sees it."""
    from somatize.watchers import FitStart, StepEnd

    log = st.CSVLog(tmp_path / "log.csv")

    def step(n):
        return StepEnd("r", n, 0, 0.5, 0.1, 4, 0.01, (0.1,))

    log.on_event(FitStart("r", epochs=1, max_steps=0, start_step=0))
    log.on_event(step(1))
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:7]))
    with pytest.raises(OSError, match=r"wrote 7 of the \d+ bytes of a row to .*log\.csv"):
        log.on_event(step(2))  # (step 1's row goes out now; 2's is not begun)
    monkeypatch.setattr(os, "write", real)
    log.on_event(step(3))
    log.close()
    assert [r["step"] for r in rows(tmp_path / "log.csv")] == ["3"]  # (1: lost to the disk)
    assert (tmp_path / "log.csv").read_bytes().endswith(b"\n")


def test_a_log_with_a_damaged_header_is_set_aside_and_started_anew(tmp_path):
    from tests.torch.test_checkpoint_resume import trainer

    log = tmp_path / "log.csv"
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[st.CSVLog(log), CrashAt(7)], pruner=None).fit(
            graph(0), data(), val=data(2)
        )
    log.write_bytes(b"\xff\xfe" + log.read_bytes()[2:])
    with pytest.warns(UserWarning, match="header of .*log.csv is damaged"):
        trainer(tmp_path, watchers=[st.CSVLog(log)], pruner=None).fit(
            graph(0), data(), val=data(2), resume="last"
        )
    assert (tmp_path / "log.csv.damaged").exists()
    assert [int(r["step"]) for r in rows(log) if r["kind"] == "step"] == list(range(7, 21))


def test_a_long_run_holds_no_rows_in_memory(tmp_path):
    """Found by an outside audit: every row was kept for the rewrite a new column needs
    (384 bytes a step, 0.4 GB over a million steps); that rewrite now reads the file back."""
    import tracemalloc

    from somatize.watchers import FitStart, Metrics, StepEnd

    log = st.CSVLog(tmp_path / "log.csv")
    log.on_event(FitStart("r", epochs=1, max_steps=0, start_step=0))

    def steps(first, end):
        for s in range(first, end):
            log.on_event(StepEnd("r", s, 0, 1.0 / s, 0.1, 8, 0.001))

    steps(1, 200)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    steps(200, 2200)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 100_000  # (770 kB before)
    log.on_event(Metrics("r", "", 2199, {"val_loss": 0.5}))  # a new column: the file rewritten
    log.close()
    got = rows(tmp_path / "log.csv")
    assert [r["step"] for r in got] == [str(s) for s in range(1, 2200)] + ["2199"]
    assert got[-1]["kind"] == "eval" and got[-1]["val_loss"] == "0.5" and got[0]["val_loss"] == ""
    assert float(got[5]["loss"]) == 1.0 / 6  # (the text read back is written back as it was)


def _with_terms(out, y):
    ce = F.cross_entropy(out, y)
    return {"loss": ce, "ce": ce, "mean": out.mean()}


def test_a_loss_of_several_terms_has_a_column_each(tmp_path):
    recorder = Recorder()
    st.Trainer(
        loss=_with_terms,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        watchers=[st.CSVLog(tmp_path / "log.csv"), recorder],
        options=st.Options(progress=False),
    ).fit(graph(0), data(), val=data(2))
    got = rows(tmp_path / "log.csv")
    steps = [r for r in got if r["kind"] == "step"]
    told = recorder.of(StepEnd)
    assert [float(r["ce"]) for r in steps] == [e.terms["ce"] for e in told]
    assert [float(r["mean"]) for r in steps] == [e.terms["mean"] for e in told]
    assert [float(r["ce"]) for r in steps] == [float(r["loss"]) for r in steps]
    evals = [r for r in got if r["kind"] == "eval"]
    assert len(evals) == 2 and all(r["val_ce"] == r["val_loss"] and r["val_mean"] for r in evals)
    assert all(r["ce"] == "" for r in evals)  # a step's column, blank on eval rows
    epochs = [r for r in got if r["kind"] == "epoch"]  # each epoch's mean, its own columns
    ends = recorder.of(EpochEnd)
    assert [float(r["epoch_loss"]) for r in epochs] == [e.loss for e in ends]
    assert [float(r["epoch_ce"]) for r in epochs] == [e.terms["ce"] for e in ends]
    assert all(r["loss"] == r["ce"] == "" for r in epochs)
    fit([st.CSVLog(tmp_path / "plain.csv")])
    assert "ce" not in rows(tmp_path / "plain.csv")[0]  # a loss alone: no column


@pytest.mark.parametrize("before", [False, True], ids=["terms-added", "terms-dropped"])
def test_a_log_resumed_with_or_without_terms_keeps_its_rows(tmp_path, before):
    """As grad_norm's column: a log written before the terms widens at the resume (the
    earlier rows blank there); one written with them keeps them, the later rows blank."""
    from tests.torch.test_checkpoint_resume import trainer

    def with_loss(loss, **kw):
        t = trainer(tmp_path, pruner=None, **kw)
        t.loss = loss  # the helper's run with another loss: the dict's is the cross-entropy
        return t

    first, then = (_with_terms, F.cross_entropy) if before else (F.cross_entropy, _with_terms)
    log = tmp_path / "log.csv"
    with pytest.raises(Crash):
        with_loss(first, watchers=[st.CSVLog(log), CrashAt(7)]).fit(graph(0), data(), val=data(2))
    assert ("ce" in rows(log)[0]) == before
    with_loss(then, watchers=[st.CSVLog(log)]).fit(graph(0), data(), val=data(2), resume="last")
    steps = [r for r in rows(log) if r["kind"] == "step"]
    assert [int(r["step"]) for r in steps] == list(range(1, 21))
    told = [bool(r["ce"]) for r in steps]
    assert told == [before] * 6 + [not before] * 14  # the checkpoint is at step 6
    assert all(r["loss"] for r in steps)
    evals = [r for r in rows(log) if r["kind"] == "eval"]
    assert [bool(r["val_ce"]) for r in evals] == [before] + [not before] * 4  # steps 4, 8...
