"""Watchers of a training run: TensorBoard, the progress line, the JSON-lines run log."""

from __future__ import annotations

import csv
import io
import pickle
import re
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, JsonLines, Node, Opaque
from somatize.watchers import FitStart, StepEnd


class Body(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 8)

    def forward(self, x, ctx):
        return Done(Opaque(torch.relu(self.lin(x))))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(8, 3)

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(Opaque(out), metrics={"logit_mean": out.detach().mean()})


def data(n: int = 3):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def fit(watchers, epochs=2, **options):
    torch.manual_seed(0)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5),
        epochs=epochs,
        metrics={"acc": st.accuracy},
        watchers=watchers,
        options=st.Options(**{"progress": False, **options}),
    )
    return trainer.fit(Graph.somatize(Body() >> Head()), data(), val=data(2))


def scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_writes_loss_lr_throughput_metrics_and_node_metrics(tmp_path):
    result = fit([st.TensorBoard(tmp_path / "tb")])
    got = scalars(tmp_path / "tb")
    assert set(got) == {
        "train/loss",
        "train/lr",
        "train/examples_per_second",
        "train/epoch",
        "train/epoch_loss",  # the epoch's mean training loss (EpochEnd.loss)
        "time/data",  # where each epoch's time went (EpochEnd.data, .steps)
        "time/steps",
        "time/epoch",  # the seconds since the previous epoch ended
        "val/loss",
        "val/acc",
        "node/head/logit_mean",
        "node/head/epoch_logit_mean",  # its epoch's mean (EpochEnd.node_metrics)
        "val/head/logit_mean",  # the node's metric during evaluation, over the whole set
    }
    assert [s for s, _ in got["val/head/logit_mean"]] == [3, 6]
    assert [v for _, v in got["val/head/logit_mean"]] == pytest.approx(
        [m["val_head/logit_mean"] for m in result.metrics]
    )
    assert got["train/loss"] == [(i + 1, pytest.approx(v)) for i, v in enumerate(result.losses)]
    assert [v for _, v in got["train/lr"]] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert got["val/loss"] == [(m["step"], pytest.approx(m["val_loss"])) for m in result.metrics]
    assert [s for s, _ in got["val/acc"]] == [3, 6]
    assert [s for s, _ in got["node/head/logit_mean"]] == [1, 2, 3, 4, 5, 6]
    assert got["train/epoch"] == [(3, 1.0), (6, 2.0)]
    assert got["train/epoch_loss"] == [
        (3, pytest.approx(result.epoch_losses[0])),
        (6, pytest.approx(result.epoch_losses[1])),
    ]
    assert got["node/head/epoch_logit_mean"] == [
        (3, pytest.approx(result.epoch_metrics["head/logit_mean"][0])),
        (6, pytest.approx(result.epoch_metrics["head/logit_mean"][1])),
    ]
    assert [s for s, _ in got["time/steps"]] == [3, 6]
    assert all(v > 0 for _, v in got["time/steps"])
    assert all(v > 0 for _, v in got["train/examples_per_second"])


def test_tensorboard_every_steps_thins_step_scalars_but_keeps_evaluations(tmp_path):
    fit([st.TensorBoard(tmp_path / "tb", every_steps=2)], eval_every_steps=3)
    got = scalars(tmp_path / "tb")
    assert [s for s, _ in got["train/loss"]] == [2, 4, 6]
    assert [s for s, _ in got["node/head/logit_mean"]] == [2, 4, 6]
    assert [s for s, _ in got["val/loss"]] == [3, 6]


def test_tensorboard_pickles_without_its_writer(tmp_path):
    tb = st.TensorBoard(tmp_path / "tb")
    fit([tb], epochs=1)
    copy = pickle.loads(pickle.dumps(tb))
    assert copy._writer is None and copy.log_dir == tb.log_dir


def test_the_core_json_lines_log_is_a_trainer_watcher(tmp_path):
    log = JsonLines(tmp_path / "run.jsonl")
    result = fit([log])
    records = JsonLines.read(tmp_path / "run.jsonl")
    kinds = [r["event"] for r in records]
    assert kinds[0] == "FitStart" and kinds[-1] == "FitEnd"
    steps = [r for r in records if r["event"] == "StepEnd"]
    assert [r["loss"] for r in steps] == pytest.approx(result.losses)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    evals = [r for r in records if r["event"] == "Metrics" and r["node"] == ""]
    assert [r["values"]["val_loss"] for r in evals] == pytest.approx(
        [m["val_loss"] for m in result.metrics]
    )
    assert [r["epoch"] for r in records if r["event"] == "EpochEnd"] == [0, 1]
    ends = [r for r in records if r["event"] == "EpochEnd"]
    assert [r["loss"] for r in ends] == result.epoch_losses and ends[0]["terms"] == {}
    node = [r for r in records if r["event"] == "Metrics" and r["node"] == "head"]
    assert len(node) == 6 and isinstance(node[0]["values"]["logit_mean"], float)
    assert log._fd is None  # the Trainer closed it at the end of the run


def test_the_progress_line_writes_to_a_given_stream(capsys):
    stream = io.StringIO()
    fit([st.Progress(stream=stream, interval=0.0, redraw=True)])  # as on a terminal
    text = stream.getvalue()
    assert "epoch 1/2 · step 1/6 · loss " in text  # the total, from the data's length
    assert "epoch 2/2 · step 6/6 · loss " in text and "lr 2.50e-02" in text
    assert "step 3 · val_loss " in text and "val_acc " in text
    assert re.search(r"done: 6 steps in [0-9.]+s\n$", text)
    assert capsys.readouterr().err == ""  # not on standard error, which is not a terminal here


def test_the_progress_line_is_on_when_asked_and_says_pruned(capsys):
    torch.manual_seed(0)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=3,
        pruner=st.Threshold("val_loss", upper=0.0),
        options=st.Options(progress=True),
    )
    trainer.fit(Graph.somatize(Body() >> Head()), data(), val=data(1))
    err = capsys.readouterr().err
    assert "step 3 · val_loss" in err and "(pruned)" in err


def test_watchers_are_closed_when_training_fails(tmp_path):
    class Boom(Exception):
        pass

    class FailAt:
        def on_event(self, event):
            if isinstance(event, StepEnd) and event.step == 2:
                raise Boom

    log = JsonLines(tmp_path / "run.jsonl")
    tb = st.TensorBoard(tmp_path / "tb")
    with pytest.raises(Boom):
        fit([log, tb, FailAt()])
    assert log._fd is None and tb._writer is None
    assert [s for s, _ in scalars(tmp_path / "tb")["train/loss"]] == [1, 2]  # flushed
    assert "FitEnd" not in [r["event"] for r in JsonLines.read(tmp_path / "run.jsonl")]


def test_tensorboard_after_a_resume_shows_each_step_once(tmp_path):
    class Crash(Exception):
        pass

    class CrashAt5:
        def on_event(self, event):
            if isinstance(event, StepEnd) and event.step == 5:
                raise Crash

    def trainer(watchers):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=3,
            checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=2),
            watchers=watchers,
            options=st.Options(progress=False),
        )

    torch.manual_seed(0)
    with pytest.raises(Crash):  # steps 1..5 logged, the checkpoint at step 4
        trainer([st.TensorBoard(tmp_path / "tb"), CrashAt5()]).fit(
            Graph.somatize(Body() >> Head()), data()
        )
    # tensorboard orders event files by name: timestamp (s), host, pid, then a per-process
    # counter compared as text; a real restart comes later, so date the first file back
    (first,) = (tmp_path / "tb").iterdir()
    stamp = first.name.split(".")[3]
    first.rename(first.with_name(first.name.replace(stamp, str(int(stamp) - 1), 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a resumed run continues the curves: no warning
        result = trainer([st.TensorBoard(tmp_path / "tb")]).fit(
            Graph.somatize(Body() >> Head()), data(), resume="last"
        )
    got = scalars(tmp_path / "tb")["train/loss"]
    assert [s for s, _ in got] == list(range(1, 10))
    assert [v for _, v in got] == pytest.approx(result.losses)


def test_tensorboard_warns_when_a_fresh_run_logs_into_a_directory_another_run_used(tmp_path):
    def fit():
        torch.manual_seed(0)
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=1,
            watchers=[st.TensorBoard(tmp_path / "tb")],
            options=st.Options(progress=False),
        ).fit(Graph.somatize(Body() >> Head()), data())

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit()  # a new directory: nothing to say
    with pytest.warns(
        RuntimeWarning, match=r"already holds the event files of an earlier run"
    ) as w:
        fit()
    assert w[0].filename == __file__  # the user's fit line, not a somatize file
    # the fix names this run's folder (it named runs/digits, whatever the run's)
    assert f"st.TensorBoard(f'{(tmp_path / 'tb').as_posix()}/lr={{lr}}')" in str(w[0].message)


def test_each_parameter_groups_rate_is_reported_logged_and_written(tmp_path):
    """Two groups (body at 0.1, head at 0.01) under a StepLR: StepEnd.lrs holds both, and
    TensorBoard and CSVLog add the second group's beside train/lr, as LearningRateMonitor."""
    from somatize.watchers import StepEnd

    class Seen:
        def __init__(self) -> None:
            self.steps: list[StepEnd] = []

        def on_event(self, event):
            if isinstance(event, StepEnd):
                self.steps.append(event)

    seen = Seen()
    torch.manual_seed(0)
    g = Graph.somatize(Body() >> Head())
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(
            [
                {"params": g["body"].lin.parameters()},
                {"params": g["head"].lin.parameters(), "lr": 0.01},
            ],
            lr=0.1,
        ),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5),
        epochs=2,
        watchers=[seen, st.TensorBoard(tmp_path / "tb"), st.CSVLog(tmp_path / "log.csv")],
        options=st.Options(progress=False),
    )
    trainer.fit(g, data())
    want = [
        (0.1, 0.01),
        (0.1, 0.01),
        (0.05, 0.005),
        (0.05, 0.005),
        (0.025, 0.0025),
        (0.025, 0.0025),
    ]
    assert [e.lrs for e in seen.steps] == [pytest.approx(w) for w in want]
    assert [e.lr for e in seen.steps] == pytest.approx([w[0] for w in want])
    got = scalars(tmp_path / "tb")
    assert [v for _, v in got["train/lr/group1"]] == pytest.approx([w[1] for w in want])
    assert "train/lr/group0" not in got and "train/lr/group2" not in got
    with open(tmp_path / "log.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "step"]
    assert [float(r["lr/group1"]) for r in rows] == pytest.approx([w[1] for w in want])


def test_one_parameter_group_reports_no_lrs():
    lrs: list[tuple[float, ...]] = []

    class Seen:
        def on_event(self, event):
            if type(event).__name__ == "StepEnd":
                lrs.append(event.lrs)

    fit([Seen()])
    assert lrs == [()] * 6


def test_tensorboard_warns_when_another_run_writes_into_its_directory_at_the_same_time(tmp_path):
    """Found by an outside audit: clients of a round on st.executor with one log_dir all start
    before any event file exists, so looking for earlier files never warned."""
    tb = tmp_path / "tb"

    def run(watchers):
        torch.manual_seed(0)
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=1,
            watchers=watchers,
            options=st.Options(progress=False),
        ).fit(Graph.somatize(Body() >> Head()), data())

    class Parallel:  # a second client starting while the first trains, before it wrote a file
        def on_event(self, event):
            if isinstance(event, StepEnd) and event.step == 1:
                assert not list(tb.glob("events.*"))  # (nothing on disk to see yet)
                with pytest.warns(RuntimeWarning) as w:
                    run([st.TensorBoard(tb)])
                said.extend(str(x.message) for x in w)

    said: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first run: nothing to say
        run([Parallel(), st.TensorBoard(tb)])
    assert len(said) == 1
    assert said[0].startswith(f"TensorBoard: another run is writing into {tb} at this moment")
    assert (
        f"a sub-folder per client, e.g. st.TensorBoard(f'{tb.as_posix()}/client{{i}}')" in said[0]
    )
    assert len(list(tb.iterdir())) == 2  # both event files, and no marker file beside them
    with pytest.warns(RuntimeWarning, match="already holds the event files of an earlier run"):
        run([st.TensorBoard(tb)])  # closed: the folder is free, the earlier files are named
    held = st.TensorBoard(tb)  # mid-run, a copy for another process drops the claim
    held.on_event(FitStart("r", epochs=1, max_steps=0, start_step=1))
    assert held._claim is not None and pickle.loads(pickle.dumps(held))._claim is None
    held.close()
    assert held._claim is None
