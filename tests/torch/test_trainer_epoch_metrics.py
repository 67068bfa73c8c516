"""Each node metric's epoch mean (epoch_metrics.py), Lightning's ``self.log(...,
on_epoch=True)``: ``TrainResult.epoch_metrics`` and ``EpochEnd.node_metrics`` — the mean
over the examples of the batches that reported it, against a plain loop and the per-step
``Metrics``; exact across a mid-epoch resume; skipped steps left out; written by
``CSVLog`` and ``TensorBoard``."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.torch.epoch_metrics import EpochMetrics
from somatize.watchers import EpochEnd, Metrics
from tests.torch.test_checkpoint_resume import Crash, CrashAt
from tests.torch.test_trainer_loss_terms import SIZES, data  # (unequal batches, a short last)
from tests.torch.trainer_helpers import quiet, step_parts

CRASH_AT: list[int | None] = [None]  # the training step at which Hidden raises Crash


class Hidden(Node):
    """Reports the share of its positive activations (a tensor) and its batch's rows (a
    float, whose weighted mean is sum(n²) / sum(n): the weights show)."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 8)

    def forward(self, x, ctx):
        if ctx.step == CRASH_AT[0] and ctx.training:  # a crash inside a step, no watcher
            raise Crash
        h = torch.tanh(self.lin(x))
        return Done(Opaque(h), metrics={"pos": (h > 0).float().mean(), "rows": float(len(x))})


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(8, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Hidden() >> Head())


def plain(g: Graph) -> tuple[nn.Linear, nn.Linear]:
    """The graph's two layers, copied: a plain network with its weights."""
    import copy

    return copy.deepcopy(g["hidden"].lin), copy.deepcopy(g["head"].lin)


def plain_epochs(batches, k, mb, epochs=2):
    """A plain loop (groups of ``k`` batches in ``mb`` chunks, each weighed by its share of
    the group's examples); each epoch's ``pos`` and ``rows`` summed by hand over every
    chunk's examples."""
    first, second = plain(graph())
    opt = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    means = []
    for _ in range(epochs):
        sums, examples = {"pos": 0.0, "rows": 0.0}, 0
        for parts, n in step_parts(batches, k, mb):
            opt.zero_grad(set_to_none=True)
            for xc, yc in parts:
                h = torch.tanh(first(xc))
                (F.cross_entropy(second(h), yc) * (len(yc) / n)).backward()
                sums["pos"] += float((h > 0).float().mean()) * len(yc)
                sums["rows"] += float(len(yc)) * len(yc)
                examples += len(yc)
            opt.step()
        means.append({f"hidden/{k}": v / examples for k, v in sums.items()})
    return means


def fit(batches, watchers=(), k=1, mb=1, epochs=2, g=None, **options) -> st.TrainResult:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        micro_batches=mb,
        watchers=list(watchers),
        options=quiet(shuffle=False, accumulate=k, **options),
    ).fit(g or graph(), batches)


@pytest.mark.parametrize(("k", "mb"), [(1, 1), (1, 3), (2, 1), (2, 3)])
@pytest.mark.parametrize("watched", [False, True], ids=["no-watcher", "watched"])
def test_each_epochs_node_metrics_are_their_mean_over_the_examples_as_a_plain_loop_sums_them(
    k, mb, watched
):
    """Without watchers (k = mb = 1: the fast path) and with them (the general step); under
    micro-batches and accumulation each chunk's value weighs by its own rows."""
    batches = data()
    want = plain_epochs(batches, k, mb)
    recorder = Recorder()
    result = fit(batches, [recorder] if watched else [], k, mb)
    assert sorted(result.epoch_metrics) == ["hidden/pos", "hidden/rows"]
    for name, got in result.epoch_metrics.items():
        assert got == pytest.approx([w[name] for w in want], rel=1e-6), name
    # rows: sum(n²) / sum(n) over the chunks, not a mean of the steps' values
    chunks = [len(yc) for parts, _ in step_parts(batches, k, mb) for _, yc in parts]
    assert result.epoch_metrics["hidden/rows"] == [sum(n * n for n in chunks) / sum(chunks)] * 2
    if watched:
        ends = recorder.of(EpochEnd)
        assert [e.node_metrics for e in ends] == [
            {"hidden": {"pos": pos, "rows": rows}}
            for pos, rows in zip(*result.epoch_metrics.values(), strict=True)
        ]


def test_asking_the_result_for_a_node_metric_as_an_evaluated_one_names_epoch_metrics():
    result = fit(data(), epochs=1)
    for name in ("hidden/pos", "train_hidden/pos"):
        with pytest.raises(KeyError, match=r"r\.epoch_metrics\['hidden/pos'\]\[-1\]"):
            result.metric(name)


def test_the_epoch_mean_is_the_per_step_metrics_weighed_by_their_examples():
    """Each step's ``Metrics`` told, weighed by its ``StepEnd.examples``: the same floats."""
    recorder = Recorder()
    result = fit(data(), [recorder])
    told = [e.values["pos"] for e in recorder.of(Metrics) if e.node == "hidden"]
    assert len(told) == 10
    for e, got in enumerate(result.epoch_metrics["hidden/pos"]):
        steps = told[e * 5 : (e + 1) * 5]
        assert got == sum(v * n for v, n in zip(steps, SIZES, strict=True)) / sum(SIZES)
    assert result.epoch_metrics["hidden/pos"][0] != pytest.approx(sum(told[:5]) / 5)


class Lit:
    """A LightningModule of the same network, logging the node's value as a Lightning user
    would: ``self.log("pos", pos, on_step=True, on_epoch=True, batch_size=len(x))``."""

    @staticmethod
    def fit(tmp_path, batches, epochs):
        L = pytest.importorskip("lightning")
        from lightning.pytorch.loggers import CSVLogger
        from torch.utils.data import DataLoader

        first, second = plain(graph())

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.first, self.second = first, second

            def training_step(self, batch, batch_idx):
                x, y = batch
                h = torch.tanh(self.first(x))
                self.log("pos", (h > 0).float().mean(), on_step=True, on_epoch=True,
                         batch_size=len(x))  # fmt: skip
                return F.cross_entropy(self.second(h), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = L.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            logger=CSVLogger(tmp_path, name="lit"),
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=1,
        )
        trainer.fit(Module(), DataLoader(batches, batch_size=None))
        with open(trainer.logger.log_dir + "/metrics.csv", newline="") as f:
            return [float(r["pos_epoch"]) for r in csv.DictReader(f) if r.get("pos_epoch")]


@pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated")
@pytest.mark.filterwarnings("ignore:The '.*' does not have many workers")
@pytest.mark.filterwarnings("ignore:.*GPU available but not used")
@pytest.mark.parametrize("watched", [False, True], ids=["no-watcher", "watched"])
def test_the_epoch_means_are_lightnings_on_epoch_mean_of_the_same_steps(tmp_path, watched):
    batches = data()
    lightning = Lit.fit(tmp_path, batches, epochs=2)
    result = fit(batches, [Recorder()] if watched else [])
    assert len(lightning) == 2
    assert result.epoch_metrics["hidden/pos"] == pytest.approx(lightning, rel=1e-6)


@pytest.mark.parametrize("crash", ["watcher", "node"])
@pytest.mark.parametrize("mb", [1, 2])
def test_a_run_resumed_in_mid_epoch_reports_the_uninterrupted_runs_means(tmp_path, crash, mb):
    """Crashed in step 8 (epoch 1, its 3rd step) after the checkpoint of step 7: the epoch's
    sums are in it, so its means span both fits, bitwise. Crashed by its node, the
    interrupted fit has no watcher: it takes the fast path (mb=1), the resumed one the
    general path; under micro-batches both the general one."""

    def run(folder, watchers=(), resume=None):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=3,
            micro_batches=mb,
            checkpoint=st.Checkpointing(tmp_path / folder, every_steps=7),
            watchers=list(watchers),
            options=quiet(),
        ).fit(graph(), data(), resume=resume)

    told, again = Recorder(), Recorder()
    reference = run("ref", [told])
    CRASH_AT[0] = 8 if crash == "node" else None
    try:
        with pytest.raises(Crash):
            run("run", [CrashAt(8)] if crash == "watcher" else [])
    finally:
        CRASH_AT[0] = None
    saved = st.load_checkpoint(tmp_path / "run" / "step-000000007.ckpt")
    assert saved["position"] == 2 and len(saved["epoch_metric_sums"]) == 1
    resumed = run("run", [again], resume="last")
    assert resumed.epoch_metrics == reference.epoch_metrics  # exactly
    assert len(set(resumed.epoch_metrics["hidden/pos"])) == 3
    assert [(e.epoch, e.node_metrics) for e in again.of(EpochEnd)] == [
        (e.epoch, e.node_metrics) for e in told.of(EpochEnd)[1:]
    ]


def test_a_checkpoint_from_before_the_sums_were_kept_resumes_with_its_own_steps(tmp_path):
    """Written by an earlier somatize: the earlier epochs' means are not known (NaN), and
    the resumed epoch's is over the steps the resumed fit takes."""
    from somatize.torch import integrity

    def run(watchers=(), resume=None):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            checkpoint=st.Checkpointing(tmp_path, every_steps=7),
            watchers=list(watchers),
            options=quiet(shuffle=False),
        ).fit(graph(), data(), resume=resume)

    with pytest.raises(Crash):
        run([CrashAt(8)])
    path = st.Checkpointing(tmp_path).file(7)
    payload = dict(st.load_checkpoint(path))
    del payload["epoch_metric_sums"], payload["epoch_metrics"]
    integrity.write_checkpoint(path, payload)
    recorder = Recorder()
    resumed = run([recorder], resume="last")
    told = [e.values["rows"] for e in recorder.of(Metrics) if e.node == "hidden"]
    assert told == [7.0, 10.0, 5.0]  # steps 8 to 10: batches 2 to 4
    assert math.isnan(resumed.epoch_metrics["hidden/rows"][0])
    assert resumed.epoch_metrics["hidden/rows"][1] == (49 + 100 + 25) / 22


class Sometimes(Hidden):
    """Reports only on batches of 10 rows, and ``late`` only from step 6 (epoch 1) on."""

    def forward(self, x, ctx):
        h = torch.tanh(self.lin(x))
        metrics = {"pos": (h > 0).float().mean()} if len(x) == 10 else {}
        if ctx.step >= 6:
            metrics["late"] = torch.tensor(float(ctx.step))
        return Done(Opaque(h), metrics=metrics or None)


@pytest.mark.parametrize("watched", [False, True], ids=["no-watcher", "watched"])
def test_a_metric_is_over_the_batches_that_reported_it_nan_in_an_epoch_without(watched):
    torch.manual_seed(0)
    g = Graph.somatize(Sometimes() >> Head())
    recorder = Recorder()
    result = fit(data(), [recorder] if watched else [], g=g)
    late = result.epoch_metrics["sometimes/late"]
    assert math.isnan(late[0]) and late[1] == (6 * 10 + 7 * 10 + 8 * 7 + 9 * 10 + 10 * 5) / 42
    assert len(result.epoch_metrics["sometimes/pos"]) == 2  # over the three batches of 10
    if watched:
        told = [e.values["pos"] for e in recorder.of(Metrics) if "pos" in e.values]
        assert result.epoch_metrics["sometimes/pos"][0] == sum(v * 10 for v in told[:3]) / 30
        assert recorder.of(EpochEnd)[0].node_metrics == {
            "sometimes": {"pos": result.epoch_metrics["sometimes/pos"][0]}
        }


def test_a_skipped_step_is_left_out():
    batches = data()
    bad = (torch.full((7, 4), math.nan), batches[2][1])  # the 7-example batch: a NaN loss
    for watched in (False, True):
        result = fit(
            [*batches[:2], bad, *batches[3:]],
            [Recorder()] if watched else [],
            epochs=1,
            nonfinite="skip",
        )
        assert result.skipped == 1
        assert result.epoch_metrics["hidden/rows"] == [(100 + 100 + 100 + 25) / 35]


def test_csvlog_and_tensorboard_write_each_epochs_means(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = fit(data(), [st.CSVLog(tmp_path / "log.csv"), st.TensorBoard(tmp_path / "tb")])
    with (tmp_path / "log.csv").open(newline="") as f:
        epochs = [row for row in csv.DictReader(f) if row["kind"] == "epoch"]
    for name in ("pos", "rows"):
        got = [float(row[f"epoch_hidden/{name}"]) for row in epochs]
        assert got == result.epoch_metrics[f"hidden/{name}"]
        events = EventAccumulator(str(tmp_path / "tb"))
        events.Reload()
        logged = events.Scalars(f"node/hidden/epoch_{name}")
        assert [e.step for e in logged] == [5, 10]
        assert [e.value for e in logged] == pytest.approx(result.epoch_metrics[f"hidden/{name}"])


def test_the_sums_of_a_checkpoint_are_plain_values_read_back_as_written():
    sums = EpochMetrics()
    sums.add({"n": {"a": torch.tensor(0.5), "b": 2}}, 10)
    sums.add({"n": {"a": torch.tensor(0.25, dtype=torch.bfloat16)}}, 4)
    state = sums.state()
    assert state == [["n", "a", 6.0, 14], ["n", "b", 20.0, 10]]
    again = EpochMetrics.restored([state])
    assert again.state() == state
    assert again.take(1) == {"n": {"a": 6.0 / 14, "b": 2.0}} and again.take(1) == {}
    # another number of ranks: rank 0 takes every rank's sums, the others none
    assert EpochMetrics.restored([state, state], rank=0, world=1).state() == [
        ["n", "a", 12.0, 28],
        ["n", "b", 40.0, 20],
    ]
    assert EpochMetrics.restored([state, state], rank=1, world=3).state() == []
    assert EpochMetrics.restored(None).state() == []
    assert EpochMetrics.restored([[["n", "a", "x", 1], ["n"], 3]]).state() == []


def test_a_metric_that_is_not_a_number_fails_naming_the_node_without_watchers():
    class Wrong(Hidden):
        def forward(self, x, ctx):
            h = torch.tanh(self.lin(x))
            return Done(Opaque(h), metrics={"act": h})  # a tensor of every row

    torch.manual_seed(0)
    with pytest.raises(TypeError, match=r"node 'wrong': 'act' must give one number per batch"):
        fit(data(), g=Graph.somatize(Wrong() >> Head()))
