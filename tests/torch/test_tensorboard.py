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
from somatize.watchers import EpochEnd, StepEnd
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


@pytest.mark.parametrize("torn", [1, 13, 40])
def test_an_event_file_torn_by_a_kill_is_served_whole_up_to_the_tear(tmp_path, torn):
    """A process killed while the writer appended leaves its last record torn (TFRecord:
    a length, its CRC, the data, its CRC). tensorboard serves the records before it and
    then the resumed run's, each step once, and reads the folder without an error."""
    with pytest.raises(Crash):  # steps 1..5 logged, the checkpoint at step 3
        trainer(tmp_path, CrashAt(5)).fit(graph(), data())
    (events,) = (tmp_path / "tb").iterdir()
    events.write_bytes(events.read_bytes()[:-torn])  # killed inside the last record
    assert [s for s, _ in served(tmp_path / "tb")] == [1, 2, 3, 4]  # (5: in the torn record)
    backdate(tmp_path / "tb")
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


def hparams_view(root):
    """What TensorBoard's HParams plugin makes of the runs under ``root``: its columns
    (hyper-parameter -> whether it differs between runs; metric tags) and its rows (run ->
    hyper-parameters, metric -> value)."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context, metadata

    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(root))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(root))
    plugin = backend_context.Context(
        base_plugin.TBContext(data_provider=provider, logdir=str(root))
    )
    ctx = context.RequestContext()
    meta = plugin.hparams_metadata(ctx, "")
    exp = plugin.experiment_from_metadata(ctx, "", True, meta, [])
    columns = {h.name: h.differs for h in exp.hparam_infos}, {m.name.tag for m in exp.metric_infos}
    rows = {}
    for run, tags in meta.items():
        start = metadata.parse_session_start_info_plugin_data(tags[metadata.SESSION_START_INFO_TAG])
        hps = {
            k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
            for k, v in start.hparams.items()
        }
        rows[run] = hps, metadata.SESSION_END_INFO_TAG in tags
    return columns, rows


def sweep_fit(log_dir, hparams, val=True, watchers=()):
    torch.manual_seed(0)
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=hparams.get("lr", 0.1)),
        epochs=1,
        metrics={"acc": st.accuracy} if val else None,
        watchers=[st.TensorBoard(log_dir, hparams=hparams), *watchers],
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Body() >> Head()), data(), val=data(2) if val else None)


def test_the_hparams_view_of_a_sweep_has_every_runs_hyperparameters_and_metrics(tmp_path):
    """Found by an outside audit: each run wrote an experiment summary, and tensorboard takes
    the first it finds as every run's columns: a sweep whose configurations differ in their
    keys lost the others' columns (momentum, batch), and lr read as not differing."""
    sweep_fit(tmp_path / "a", {"lr": 0.1}, val=False)
    sweep_fit(tmp_path / "b", {"lr": 0.03, "momentum": 0.9})
    sweep_fit(tmp_path / "c", {"lr": 0.01, "batch": 8, "nesterov": True, "layers": [4, 8]})
    (hparams, metrics), rows = hparams_view(tmp_path)
    assert hparams == {"lr": True, "momentum": False, "batch": False, "nesterov": False,
                       "layers": False}  # fmt: skip
    assert {"train/loss", "val/loss", "val/acc"} <= metrics
    assert rows["c"] == ({"lr": 0.01, "batch": 8.0, "nesterov": True, "layers": "[4, 8]"}, True)
    assert rows["a"] == ({"lr": 0.1}, True)


def test_the_hparams_of_a_run_are_written_as_it_starts(tmp_path):
    """A run that fails (or is still training) is in the HParams view with its
    hyper-parameters, no end marked, as Lightning logs them at the start; before, only a
    run that ended was."""
    with pytest.raises(Crash):
        sweep_fit(tmp_path / "failed", {"lr": 0.05, "tag": None}, watchers=[CrashAt(2)])
    _, rows = hparams_view(tmp_path)
    assert rows["failed"] == ({"lr": 0.05, "tag": "None"}, False)


def test_the_hparams_view_of_a_run_resumed_with_nothing_left_to_train(tmp_path):
    """Killed after its last checkpoint, before it ended, then resumed: the resumed run
    trains and evaluates nothing, yet the view has its metrics (the interrupted run's
    scalars, in the same folder) and marks its end."""
    from somatize.watchers import FitEnd

    class DieAtTheEnd:
        def on_event(self, event):
            if isinstance(event, FitEnd):
                raise Crash

    def fit(*watchers, resume=None):
        torch.manual_seed(0)
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            metrics={"acc": st.accuracy},
            checkpoint=st.Checkpointing(tmp_path / "ckpt"),
            watchers=[*watchers, st.TensorBoard(tmp_path / "tb", hparams={"lr": 0.1})],
            options=st.Options(progress=False),
        ).fit(Graph.somatize(Body() >> Head()), data(), val=data(2), resume=resume)

    with pytest.raises(Crash):
        fit(DieAtTheEnd())
    assert hparams_view(tmp_path)[1]["tb"] == ({"lr": 0.1}, False)
    backdate(tmp_path / "tb")
    fit(resume="last")
    (_, metrics), rows = hparams_view(tmp_path)
    assert {"train/loss", "val/loss", "val/acc"} <= metrics
    assert rows["tb"] == ({"lr": 0.1}, True)


def test_a_watcher_reused_for_another_fit_writes_each_runs_own_start_and_end(tmp_path):
    tb = st.TensorBoard(tmp_path / "a", hparams={"lr": 0.1})
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[tb],
        options=st.Options(progress=False),
    )
    trainer.fit(graph(), data())
    tb.log_dir, tb.hparams = str(tmp_path / "b"), {"lr": 0.1, "stage": 2}
    trainer.fit(graph(), data())
    _, rows = hparams_view(tmp_path)
    assert rows == {"a": ({"lr": 0.1}, True), "b": ({"lr": 0.1, "stage": 2.0}, True)}


def test_a_steps_scalars_are_one_event(tmp_path):
    """Found by an outside audit: add_scalar wrote an event per value, and the writer thread
    woke for each (102 Python calls a step, 36 now); a step's scalars go in one event, the
    values as before, read back by tag."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    torch.manual_seed(0)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        metrics={"acc": st.accuracy},
        watchers=[st.TensorBoard(tmp_path / "tb")],
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Body() >> Head()), data(), val=data(2))
    (path,) = (tmp_path / "tb").iterdir()
    tags: dict[int, list[list[str]]] = {}
    for event in EventFileLoader(str(path)).Load():
        if event.summary.value:
            tags.setdefault(event.step, []).append([v.tag for v in event.summary.value])
    step = ["train/loss", "train/lr", "train/examples_per_second"]
    node = ["node/head/logit_mean"]
    assert tags[1] == tags[2] == [step, node]
    val = ["val/loss", "val/acc", "val/head/logit_mean"]
    assert tags[3] == [
        step,
        node,
        val,
        [
            "train/epoch",
            "train/epoch_loss",
            "node/head/epoch_logit_mean",  # (the node metric's epoch mean)
            "time/data",
            "time/steps",
            "time/epoch",
        ],
    ]
    assert [v for _, v in served(tmp_path / "tb")] == pytest.approx(result.losses)
    assert [s for s, _ in served(tmp_path / "tb", "val/acc")] == [3, 6]


def test_flush_writes_out_the_steps_held_back(tmp_path):
    """Events go to the writer about once a second; a checkpoint (``flush()``) or the end
    must not wait for that."""
    from somatize.watchers import FitStart

    tb = st.TensorBoard(tmp_path / "tb")
    tb.on_event(FitStart("r", epochs=1, max_steps=0, start_step=0))
    for step in range(1, 6):
        tb.on_event(StepEnd("r", step, 0, 1.0 / step, 0.1, 8, 0.01))
    tb.flush()
    got = served(tmp_path / "tb")
    assert [s for s, _ in got] == [1, 2, 3, 4, 5]
    assert [v for _, v in got] == pytest.approx([1.0 / s for s in range(1, 6)])
    tb.on_event(StepEnd("r", 6, 0, 0.5, 0.1, 8, 0.01))
    tb.close()
    assert [s for s, _ in served(tmp_path / "tb")] == list(range(1, 7))


def test_a_fit_failing_before_its_first_step_leaves_no_empty_log_dir(tmp_path):
    existing = tmp_path / "runs"
    existing.mkdir()
    bad = [(torch.randn(2, 5), torch.randint(0, 3, (2,)))]  # (5 features for a 4-input model)
    fit = st.Trainer(
        loss=torch.nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[st.TensorBoard(existing / "sweep" / "lr=0.1")],
        options=st.Options(progress=False),
    )
    with pytest.raises(RuntimeError):
        fit.fit(torch.nn.Linear(4, 3), bad)
    assert list(existing.iterdir()) == []  # (the folders it made, gone; the user's kept)


@pytest.mark.parametrize("options", [{"clip_grad_norm": 0.1}, {"log_grad_norm": True}])
def test_the_gradient_norm_is_written_beside_the_loss(tmp_path, options):
    """``train/grad_norm`` on the loss's steps, the norm ``StepEnd`` told (a default run
    writes none: ``test_a_steps_scalars_are_one_event`` lists a step's tags)."""
    from somatize import Recorder

    recorder = Recorder()
    torch.manual_seed(0)
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        watchers=[st.TensorBoard(tmp_path / "tb"), recorder],
        options=st.Options(progress=False, **options),
    ).fit(Graph.somatize(Body() >> Head()), data())
    norms = served(tmp_path / "tb", "train/grad_norm")
    told = recorder.of(StepEnd)
    assert (
        [s for s, _ in norms] == [s for s, _ in served(tmp_path / "tb")] == [e.step for e in told]
    )
    assert [v for _, v in norms] == pytest.approx([e.grad_norm for e in told], rel=1e-6)
    assert all(v > 0.1 for _, v in norms)  # (under clipping: the norm before it)


def test_a_loss_of_several_terms_writes_each_per_step_and_per_evaluation(tmp_path):
    from somatize import Recorder

    def loss(out, y):
        ce = F.cross_entropy(out, y)
        return {"loss": ce + 0.1 * out.pow(2).mean(), "ce": ce, "sq": out.pow(2).mean()}

    recorder = Recorder()
    result = st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        watchers=[st.TensorBoard(tmp_path / "tb"), recorder],
        options=st.Options(progress=False),
    ).fit(graph(), data(), val=data(2))
    told = recorder.of(StepEnd)
    for term in ("ce", "sq"):
        written = served(tmp_path / "tb", f"train/{term}")
        assert [s for s, _ in written] == [e.step for e in told]
        assert [v for _, v in written] == pytest.approx([e.terms[term] for e in told], rel=1e-6)
        evaluated = served(tmp_path / "tb", f"val/{term}")
        assert [s for s, _ in evaluated] == [m["step"] for m in result.metrics]
        assert [v for _, v in evaluated] == pytest.approx(
            [m[f"val_{term}"] for m in result.metrics], rel=1e-6
        )
        epochs = served(tmp_path / "tb", f"train/epoch_{term}")  # each epoch's mean
        ends = recorder.of(EpochEnd)
        assert epochs == [(e.step, pytest.approx(e.terms[term], rel=1e-6)) for e in ends]
    assert [v for _, v in served(tmp_path / "tb", "train/epoch_loss")] == pytest.approx(
        result.epoch_losses, rel=1e-6
    )


def test_a_resumed_run_serves_each_epochs_mean_loss_once_as_the_uninterrupted_run(tmp_path):
    """Crashed at step 5 after the checkpoint of step 4, in epoch 1 (3 steps an epoch):
    that epoch's mean is written once, by the resumed fit, over both fits' steps."""
    with pytest.raises(Crash):
        trainer(tmp_path, CrashAt(5), every_steps=2).fit(graph(), data())
    backdate(tmp_path / "tb")
    result = trainer(tmp_path, every_steps=2).fit(graph(), data(), resume="last")
    reference = trainer(tmp_path / "ref", every_steps=2).fit(graph(), data())
    got = served(tmp_path / "tb", "train/epoch_loss")
    assert [s for s, _ in got] == [3, 6, 9]  # (float32 in the file)
    assert [v for _, v in got] == pytest.approx(result.epoch_losses, rel=1e-6)
    assert result.epoch_losses == reference.epoch_losses
