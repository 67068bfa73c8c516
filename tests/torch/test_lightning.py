"""somatize.torch.lightning: a graph trained by the real lightning.Trainer (CPU, tiny data)."""

from __future__ import annotations

import collections
import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import (  # noqa: E402
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
)
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger  # noqa: E402

import somatize.torch as st  # noqa: E402
from somatize import DiskKeeper, Done, Graph, JsonLines, Node, Opaque, Recorder  # noqa: E402
from somatize.errors import CheckpointError  # noqa: E402
from somatize.torch.lightning import LightningGraph, Watch, result  # noqa: E402
from somatize.watchers import EpochEnd, FitEnd, FitStart, Metrics, StepEnd  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    # the nodes count their calls in CALLS, which their keys cannot (and need not) see
    pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS"),
    *QUIET,
    NO_VAL,  # fitting without validation data is a normal run here, as in the Trainer
]

ROOT = Path(__file__).resolve().parents[2]
SGD = 0.5


class Hidden(Node):
    def __init__(self, i: int, o: int):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        h = torch.relu(self.lin(x))
        return Done(Opaque(h), metrics={"mean": h.detach().mean()})


class Out(Node):
    def __init__(self, i: int, o: int):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def _graph(seed: int = 0) -> Graph:
    torch.manual_seed(seed)
    return Graph.somatize(Hidden(8, 16) >> Out(16, 3))


def _tensors(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    return x, x[:, :3].argmax(dim=1)


def _loader(n: int = 64, seed: int = 0, batch: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(*_tensors(n, seed)), batch_size=batch)


def _lg(g: Graph, lr: float = SGD, **kw) -> LightningGraph:
    return LightningGraph(
        g,
        loss=nn.functional.cross_entropy,
        optimizer=kw.pop("optimizer", lambda ps: torch.optim.SGD(ps, lr=lr)),
        metrics={"acc": st.accuracy},
        **kw,
    )


def _trainer(root: Path, **kw) -> L.Trainer:
    callbacks = kw.pop("callbacks", [])
    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
        "log_every_n_steps": 1,
        "default_root_dir": str(root),
        "enable_checkpointing": any(isinstance(c, ModelCheckpoint) for c in callbacks),
        "callbacks": callbacks,
    }
    settings.update(kw)
    return L.Trainer(**settings)


def _assert_same_state(a, b, **tol) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], **(tol or {"rtol": 1e-6, "atol": 1e-7}), msg=k)


# -- the optional extra -----------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )


@pytest.mark.slow
def test_importing_somatize_and_somatize_torch_does_not_import_lightning():
    done = _python(
        """
        import sys
        import somatize, somatize.torch
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                        ("lightning", "pytorch_lightning", "lightning_fabric"))
        print(loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_missing_lightning_raises_an_error_naming_the_extra():
    done = _python(
        """
        import sys
        sys.modules["lightning"] = None  # as if the package were not installed
        from somatize.errors import MissingExtraError
        try:
            import somatize.torch.lightning
        except MissingExtraError as e:
            assert isinstance(e, ImportError)
            print(e)
        else:
            raise SystemExit("no MissingExtraError")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "somatize[lightning]" in done.stdout


# -- the adapter ------------------------------------------------------------------------


def test_lightning_graph_is_a_lightning_module_holding_the_graph_weights():
    g = _graph()
    lg = _lg(g)
    assert isinstance(lg, L.LightningModule)
    assert lg.net is st.module(g)
    assert sorted(lg.state_dict()) == sorted(f"net.{k}" for k in st.state(g))
    x, _ = _tensors(4)
    torch.testing.assert_close(lg(x), st.module(g)(x))
    assert lg.hparams["topology"] == g.topology.to_json()
    assert lg.hparams["loss_name"] == "cross_entropy"
    assert (lg.hparams["optimizer_name"], lg.hparams["lr"]) == ("SGD", SGD)
    assert lg.hparams["metric_names"] == ["acc"]
    assert lg.hparams["scheduler_name"] is None
    scheduled = _lg(g, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1))
    assert scheduled.hparams["scheduler_name"] == "StepLR"
    with pytest.raises(TypeError, match="factory over parameters"):
        LightningGraph(
            g, loss=None, optimizer=torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1)
        )


def test_training_reduces_the_loss(tmp_path):
    lg = _lg(_graph())
    trainer = _trainer(tmp_path, max_epochs=4)
    trainer.fit(lg, _loader(), _loader(seed=1))
    assert len(lg.losses) == trainer.global_step == 16
    assert [r["epoch"] for r in lg.history] == [0, 1, 2, 3]
    assert lg.history[-1]["val_loss"] < lg.history[0]["val_loss"]
    assert sum(lg.losses[-4:]) < sum(lg.losses[:4])
    assert trainer.callback_metrics["val_loss"] == pytest.approx(
        lg.history[-1]["val_loss"], rel=1e-5
    )


class _Dicts(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


def test_dict_batches_train_like_tuples(tmp_path):
    tuples, dicts = _lg(_graph()), _lg(_graph())
    _trainer(tmp_path, max_epochs=1).fit(tuples, _loader())
    _trainer(tmp_path, max_epochs=1).fit(dicts, DataLoader(_Dicts(*_tensors()), batch_size=16))
    _assert_same_state(st.state(tuples.graph), st.state(dicts.graph))


def test_model_checkpoint_writes_files_and_monitors_somatize_metrics(tmp_path):
    lg = _lg(_graph())
    by_acc = ModelCheckpoint(
        tmp_path / "acc", monitor="val_acc", mode="max", save_top_k=2, save_last=True
    )
    by_node = ModelCheckpoint(tmp_path / "node", monitor="val_hidden/mean", mode="max")
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[by_acc, by_node])
    trainer.fit(lg, _loader(), _loader(seed=1))
    written = sorted(p.name for p in (tmp_path / "acc").glob("*.ckpt"))
    assert "last.ckpt" in written and len(written) == 3
    assert Path(by_acc.best_model_path).is_file()
    best_acc = max(r["val_acc"] for r in lg.history)
    assert float(by_acc.best_model_score) == pytest.approx(best_acc, rel=1e-6)
    assert by_node.best_model_score is not None and Path(by_node.best_model_path).is_file()
    r = result(trainer, lg)
    assert (r.monitor, r.best) == ("val_acc", pytest.approx(best_acc, rel=1e-6))
    assert r.checkpoint == by_acc.last_model_path


def test_early_stopping_stops_a_run_whose_metric_stalls(tmp_path):
    lg = _lg(_graph(), lr=0.0)  # nothing moves: val_loss is the same every epoch
    stop = EarlyStopping("val_loss", patience=2)
    trainer = _trainer(tmp_path, max_epochs=10, callbacks=[stop])
    trainer.fit(lg, _loader(), _loader(seed=1))
    assert stop.stopped_epoch == 2
    assert len(lg.history) == 3
    r = result(trainer, lg)
    assert r.pruned and r.epochs < 10 and r.steps == 12
    assert r.pruned_reason == stop.stopping_reason_message
    assert r.pruned_reason.startswith("Monitored metric val_loss did not improve")


# ckpt_path="last" looks in the ModelCheckpoint's directory, which the first run filled.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_resume_from_last_continues_step_count_and_weights(tmp_path):
    def momentum(ps):
        return torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # a state the checkpoint must carry

    ckpt = tmp_path / "ckpt"
    first = _lg(_graph(0), optimizer=momentum)
    _trainer(tmp_path, max_epochs=2, callbacks=[ModelCheckpoint(ckpt, save_last=True)]).fit(
        first, _loader()
    )
    assert (ckpt / "last.ckpt").is_file()

    resumed = _lg(_graph(7), optimizer=momentum)  # other weights: the checkpoint must replace them
    trainer = _trainer(tmp_path, max_epochs=4, callbacks=[ModelCheckpoint(ckpt, save_last=True)])
    trainer.fit(resumed, _loader(), ckpt_path="last")

    straight = _lg(_graph(0), optimizer=momentum)
    _trainer(tmp_path, max_epochs=4).fit(straight, _loader())
    assert trainer.global_step == 16
    assert len(resumed.losses) == 16  # the first run's losses came back with the checkpoint
    assert resumed.losses == pytest.approx(straight.losses, rel=1e-6)
    _assert_same_state(st.state(resumed.graph), st.state(straight.graph))
    assert result(trainer, resumed).num_examples == 64


def test_load_from_checkpoint_restores_weights_and_refuses_another_graph(tmp_path):
    lg = _lg(_graph(0))
    ck = ModelCheckpoint(tmp_path / "ck")
    _trainer(tmp_path, max_epochs=1, callbacks=[ck]).fit(lg, _loader())
    g = _graph(3)
    loaded = LightningGraph.load_from_checkpoint(
        ck.best_model_path,
        g=g,
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=SGD),
    )
    assert loaded.graph is g
    _assert_same_state(st.state(g), st.state(lg.graph), rtol=0, atol=0)
    other = Graph.somatize(Hidden(8, 16) >> Out(16, 3) >> Out(3, 3))
    with pytest.raises(CheckpointError, match="topology"):
        LightningGraph.load_from_checkpoint(
            ck.best_model_path, g=other, loss=None, optimizer=lambda ps: torch.optim.SGD(ps, lr=1)
        )


def test_load_from_checkpoint_without_an_optimizer_predicts_as_the_trained_model(tmp_path):
    from somatize.errors import SettingError

    lg = _lg(_graph(0))
    ck = ModelCheckpoint(tmp_path / "ck")
    _trainer(tmp_path, max_epochs=2, callbacks=[ck]).fit(lg, _loader())
    # inference only: no optimizer factory to write
    loaded = LightningGraph.load_from_checkpoint(
        ck.best_model_path, g=_graph(3), loss=nn.functional.cross_entropy
    )
    x, y = _tensors(32, seed=5)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    got = torch.cat(_trainer(tmp_path).predict(loaded, loader))
    lg.eval()
    with torch.no_grad():
        want = torch.cat([lg.net(xb) for xb, _ in loader])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    _trainer(tmp_path).validate(loaded, loader)
    lg_val = _trainer(tmp_path).validate(lg, loader)
    assert loaded.validated[-1]["val_loss"] == pytest.approx(lg_val[0]["val_loss"], rel=1e-6)
    # fit without one names the fix (Lightning configures optimizers only to fit)
    with pytest.raises(SettingError, match="optimizer="):
        _trainer(tmp_path, max_epochs=1).fit(loaded, _loader())
    with pytest.raises(SettingError, match="optimizer="):
        _trainer(tmp_path, max_epochs=1).fit(LightningGraph(_graph(1), loss=None), _loader())


def test_test_and_predict_steps(tmp_path):
    lg = _lg(_graph())
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(lg, _loader())
    (tested,) = trainer.test(lg, _loader(seed=1), verbose=False)
    assert {"test_loss", "test_acc", "test_hidden/mean"} <= set(tested)
    assert 0.0 <= tested["test_acc"] <= 1.0
    predicted = trainer.predict(lg, _loader(seed=1))
    assert [p.shape for p in predicted] == [torch.Size([16, 3])] * 4
    x, _ = _tensors(64, seed=1)
    torch.testing.assert_close(torch.cat(predicted), st.module(lg.graph)(x))


def test_a_node_metric_that_is_not_a_scalar_is_an_error_naming_the_node(tmp_path):
    class Wide(Node):
        def __init__(self):
            self.lin = nn.Linear(8, 3)

        def forward(self, x, ctx):
            y = self.lin(x)
            return Done(Opaque(y), metrics={"logits": y.detach()})

    lg = _lg(Graph.somatize(Wide()))
    with pytest.raises(TypeError, match="node 'wide' metric 'logits'"):
        _trainer(tmp_path, max_steps=1).fit(lg, _loader())


# -- frozen and cached nodes ------------------------------------------------------------

CALLS: collections.Counter[str] = collections.Counter()  # not data: stays out of node keys
MODES: list[bool] = []


class Encoder(Node):
    def __init__(self, i: int, o: int):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        CALLS["encoder"] += 1
        MODES.append(self.lin.training)
        return Done(torch.relu(self.lin(x)))  # data (no grad: the node is frozen), so cacheable


# Frozen nodes are in eval mode at the start of training on purpose; Lightning points it out.
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_frozen_nodes_stay_frozen_and_cached_nodes_keep_caching(tmp_path):
    torch.manual_seed(0)
    g = Graph.somatize(Encoder(8, 16) >> Out(16, 3))
    g.freeze("encoder").cache("encoder")
    lg = _lg(g)
    before = st.state(g)
    CALLS.clear()
    MODES.clear()
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(lg, _loader())
    assert trainer.global_step == 8
    assert CALLS["encoder"] == 4  # 4 distinct batches, computed once each over two epochs
    assert MODES == [False] * 4
    after = st.state(g)
    for k in ("encoder.lin.weight", "encoder.lin.bias"):
        assert torch.equal(after[k], before[k])
    assert not torch.equal(after["out.lin.weight"], before["out.lin.weight"])
    encoder = lg.net.encoder.lin
    assert not any(p.requires_grad for p in encoder.parameters())
    lg.train()
    assert not encoder.training and lg.net.out.lin.training
    assert {id(p) for p in lg.trainer.optimizers[0].param_groups[0]["params"]} == {
        id(p) for p in st.parameters(g)
    }


@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_cache_counts_are_logged_per_epoch_and_given_in_the_result(tmp_path):
    torch.manual_seed(0)
    g = Graph.somatize(Encoder(8, 16) >> Out(16, 3))
    g.freeze("encoder").cache("encoder", per="example")
    lg = _lg(g)
    logger = CSVLogger(str(tmp_path), name="csv", version=0)
    recorder = Recorder()  # somatize watchers through Watch see the same counts
    trainer = _trainer(tmp_path, max_epochs=3, logger=logger, callbacks=[Watch([recorder])])
    trainer.fit(lg, DataLoader(TensorDataset(*_tensors()), batch_size=16, shuffle=True),
                _loader(seed=1))  # fmt: skip
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rates = [float(r["cache/encoder/hit_rate"]) for r in csv.DictReader(f)
                 if r.get("cache/encoder/hit_rate")]  # fmt: skip
    assert rates == [0.0, 1.0, 1.0]  # one per epoch
    assert [e.cache for e in recorder.of(EpochEnd)] == [
        {"encoder": {"hits": 0, "misses": 64}},
        {"encoder": {"hits": 64, "misses": 0}},
        {"encoder": {"hits": 64, "misses": 0}},
    ]
    # 64 training rows: computed once, found twice; the validation rows are not counted
    assert result(trainer, lg).cache == {"encoder": {"hits": 128, "misses": 64}}
    assert g.watchers == []  # the tally was the fit's own


# -- loggers, LR monitor and the watcher bridge (one run, several checks) ----------------


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("logged")
    lg = _lg(
        _graph(), scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    )
    recorder = Recorder()
    watch = Watch([recorder, st.TensorBoard(root / "watcher"), JsonLines(root / "run.jsonl")])
    logger = TensorBoardLogger(str(root), name="tb", version=0)
    trainer = _trainer(
        root,
        max_epochs=2,
        logger=logger,
        callbacks=[LearningRateMonitor(logging_interval="step"), watch],
    )
    trainer.fit(lg, _loader(), _loader(seed=1))
    return SimpleNamespace(root=root, lg=lg, trainer=trainer, recorder=recorder, logger=logger)


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_learning_rate_monitor_logs_the_scheduled_rate(logged):
    lrs = [v for _, v in _scalars(Path(logged.logger.log_dir))["lr-SGD"]]
    # a plain scheduler steps once per epoch (4 steps each), as Lightning's default does
    assert lrs == pytest.approx([SGD] * 4 + [SGD * 0.5] * 4)


def test_tensorboard_logger_event_file_holds_node_metrics(logged):
    scalars = _scalars(Path(logged.logger.log_dir))
    assert {"train_loss", "val_loss", "val_acc", "hidden/mean", "val_hidden/mean"} <= set(scalars)
    assert len(scalars["hidden/mean"]) == logged.trainer.global_step == 8
    assert all(v >= 0 for _, v in scalars["hidden/mean"])  # a mean of relu outputs
    val_loss = [v for _, v in scalars["val_loss"]]
    assert val_loss == pytest.approx([r["val_loss"] for r in logged.lg.history], rel=1e-5)


def test_watch_forwards_lightnings_lifecycle_as_somatize_events(logged):
    rec = logged.recorder
    assert isinstance(rec.events[0], FitStart) and isinstance(rec.events[-1], FitEnd)
    assert (rec.events[0].epochs, rec.events[0].start_step) == (2, 0)
    steps = rec.of(StepEnd)
    assert [e.step for e in steps] == list(range(1, 9))
    assert [e.loss for e in steps] == pytest.approx(logged.lg.losses)
    assert [e.examples for e in steps] == [16] * 8
    assert [e.lr for e in steps] == pytest.approx([SGD] * 4 + [SGD * 0.5] * 4)
    metrics = [m for m in rec.of(Metrics) if m.node]
    assert {m.node for m in metrics} == {"hidden"} and len(metrics) == 8
    evaluations = [m for m in rec.of(Metrics) if not m.node]  # as the somatize Trainer sends
    assert [e.values["val_loss"] for e in evaluations] == [r["val_loss"] for r in logged.lg.history]
    epochs = rec.of(EpochEnd)
    assert [e.epoch for e in epochs] == [0, 1]
    assert [e.metrics["val_loss"] for e in epochs] == [r["val_loss"] for r in logged.lg.history]
    end = rec.of(FitEnd)[0]
    assert (end.step, end.epoch, end.pruned) == (8, 2, False)


def test_somatize_watchers_write_under_lightning(logged):
    scalars = _scalars(logged.root / "watcher")
    tags = {"train/loss", "train/lr", "val/loss", "val/acc", "val/hidden/mean", "node/hidden/mean"}
    assert tags <= set(scalars)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 9))
    records = JsonLines.read(logged.root / "run.jsonl")
    kinds = collections.Counter(r["event"] for r in records)
    # 8 node metrics (one per step) and 2 evaluations (node "", as the somatize Trainer sends)
    assert kinds == {"FitStart": 1, "StepEnd": 8, "Metrics": 10, "EpochEnd": 2, "FitEnd": 1}


# -- level 3 ----------------------------------------------------------------------------


def _weighted_average(results):
    """The stand-in for st.fedavg while it is not on this branch: weighted by num_examples."""
    total = sum(r.num_examples for r in results)
    return {
        k: sum(r.state[k] * (r.num_examples / total) for r in results) for k in results[0].state
    }


def test_result_feeds_fedavg(tmp_path):
    start = st.state(_graph(0))
    results = []
    for n, seed in ((32, 1), (96, 2)):
        g = _graph(9)
        st.load_state(g, start)
        lg = _lg(g)
        trainer = _trainer(tmp_path, max_epochs=2)
        trainer.fit(lg, _loader(n, seed), _loader(16, seed + 10))
        r = result(trainer, lg)
        assert isinstance(r, st.TrainResult)
        assert (r.num_examples, r.steps, r.epochs) == (n, trainer.global_step, 2)
        assert r.losses == lg.losses and len(r.losses) == r.steps
        assert r.metrics == lg.history and r.best == min(m["val_loss"] for m in r.metrics)
        assert not r.pruned and r.checkpoint is None and r.seconds > 0
        _assert_same_state(r.state, st.state(g), rtol=0, atol=0)
        assert r.metric("val_acc") == lg.history[-1]["val_acc"]  # what summarize reads
        results.append(r)
    average = getattr(st, "fedavg", _weighted_average)(results)
    a, b = results[0].state, results[1].state
    _assert_same_state(average, {k: (32 * a[k] + 96 * b[k]) / 128 for k in a}, rtol=1e-5, atol=1e-6)
    g = _graph(5)
    st.load_state(g, average)  # matched by name: the state of a Lightning run fits module(g)


# -- the differential test --------------------------------------------------------------


def _twins() -> tuple[Graph, Graph, dict[str, torch.Tensor]]:
    """Two graphs starting from the same weights (one for each trainer), and those weights."""
    start = st.state(_graph(0))
    ours, theirs = _graph(1), _graph(2)
    st.load_state(ours, start)
    st.load_state(theirs, start)
    return ours, theirs, start


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.3)


def test_somatize_trainer_and_lightning_end_with_equal_weights(tmp_path):
    ours, theirs, start = _twins()
    sgd = _sgd

    def sched(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    somatize_trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=sgd,
        scheduler=sched,
        epochs=3,
        seed=0,
        options=st.Options(shuffle=False, progress=False, scheduler_every="epoch"),
    )
    ref = somatize_trainer.fit(ours, _loader())

    lg = LightningGraph(theirs, loss=nn.functional.cross_entropy, optimizer=sgd, scheduler=sched)
    trainer = _trainer(tmp_path, max_epochs=3)
    trainer.fit(lg, _loader())
    r = result(trainer, lg)

    assert (r.steps, r.epochs, r.num_examples) == (ref.steps, ref.epochs, ref.num_examples)
    assert r.losses == pytest.approx(ref.losses, rel=1e-6)
    _assert_same_state(r.state, ref.state)
    assert not torch.equal(r.state["out.lin.weight"], start["out.lin.weight"])


@pytest.mark.slow
def test_the_recipe_runs(tmp_path):
    pytest.importorskip("sklearn")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    recipe = ROOT / "recipes" / "lightning_callbacks.py"
    done = subprocess.run(
        [sys.executable, str(recipe), "--epochs", "2", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    best = next(line for line in done.stdout.splitlines() if line.startswith("best val_acc"))
    assert 0.5 < float(best.split()[-1]) <= 1.0  # digits: well above chance (0.1) after 2 epochs
    # the cosine is sized in optimizer steps and stepped at each: it ends at 0 (stepped
    # once per epoch, it would end at 3e-3 * (1 + cos(pi * 2 / 44)) / 2 = 0.00298)
    lr = next(line for line in done.stdout.splitlines() if line.startswith("final lr"))
    assert float(lr.split()[-1]) < 1e-9
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))


def test_a_metric_object_is_computed_over_the_whole_validation_set(tmp_path):
    torchmetrics = pytest.importorskip("torchmetrics")
    f1 = torchmetrics.classification.MulticlassF1Score(num_classes=3, average="macro")
    g = _graph()
    lg = LightningGraph(
        g,
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"f1": f1},
    )
    val = _loader(seed=1)
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(lg, _loader(), val)
    ref = torchmetrics.classification.MulticlassF1Score(num_classes=3, average="macro")
    with torch.no_grad():
        for x, y in val:
            ref.update(st.module(g)(x), y)
    assert lg.history[-1]["val_f1"] == pytest.approx(float(ref.compute()))
    assert float(trainer.callback_metrics["val_f1"]) == pytest.approx(float(ref.compute()))


def test_carried_state_is_reset_at_each_epoch_and_validation_start(tmp_path):
    from somatize import Done, Node, Opaque

    class Recurrent(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(8, 3)
            self.hidden = st.Carry()
            self.starts: list[tuple[bool, bool]] = []

        def forward(self, x, ctx):
            self.starts.append((ctx.training, self.hidden.value is None))
            out = self.lin(x)
            self.hidden.set(out)
            return Done(Opaque(out))

    node = Recurrent()
    lg = LightningGraph(
        Graph.somatize(node),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
    )
    _trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0).fit(lg, _loader(), _loader(seed=1))
    train_starts = [fresh for training, fresh in node.starts if training]
    val_starts = [fresh for training, fresh in node.starts if not training]
    assert train_starts.count(True) == 2  # once per epoch
    assert val_starts.count(True) == 2  # once per validation
    assert train_starts[4] is True and not any(train_starts[1:4])


def test_a_loss_class_is_refused_when_made_naming_the_instance_and_the_function():
    from somatize.errors import SettingError

    with pytest.raises(
        SettingError,
        match=r"class CrossEntropyLoss.*CrossEntropyLoss\(\) or "
        r"F.cross_entropy",
    ):
        LightningGraph(
            _graph(), loss=nn.CrossEntropyLoss, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)
        )


class _RunsCode:
    def __reduce__(self):
        return (print, ("*** code from the checkpoint ran ***",))


@pytest.mark.filterwarnings("ignore:Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
def test_load_from_checkpoint_runs_no_pickled_code_even_when_the_environment_says_so(
    tmp_path, monkeypatch, capsys
):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": _RunsCode()}, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # an explicit value wins
    with pytest.raises(Exception, match="Weights only load failed"):
        LightningGraph.load_from_checkpoint(
            path, g=_graph(), loss=None, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)
        )
    assert "code from the checkpoint ran" not in capsys.readouterr().out


# ckpt_path="last" looks in the ModelCheckpoint's directory, which the first run filled.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_cache_counts_of_a_resumed_run_are_the_whole_runs(tmp_path):
    class Plain(Node):  # (Encoder reads module-level data, which enters its key)
        def __init__(self) -> None:
            self.lin = nn.Linear(8, 16)

        def forward(self, x, ctx):
            return Done(torch.relu(self.lin(x)))

    def run(epochs: int, **kw):
        torch.manual_seed(0)  # the same weights: a new graph over the same disk keeper hits
        enc = Plain().with_id("encoder")
        g = Graph.somatize(enc >> Out(16, 3), keeper=DiskKeeper(tmp_path / "keep"))
        g.freeze("encoder").cache("encoder", per="example")
        lg = _lg(g)
        save = ModelCheckpoint(tmp_path / "ckpt", save_last=True)
        trainer = _trainer(tmp_path, max_epochs=epochs, callbacks=[save])
        data = DataLoader(TensorDataset(*_tensors()), batch_size=16, shuffle=True)
        trainer.fit(lg, data, **kw)
        return trainer, lg

    run(1)  # one epoch: 64 misses, written to the checkpoint
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["somatize"]["cache"][0]["total"] == {"encoder": {"hits": 0, "misses": 64}}
    trainer, lg = run(3, ckpt_path="last")  # two more, with new objects, as a new process
    assert result(trainer, lg).cache == {"encoder": {"hits": 128, "misses": 64}}  # the run's
    old = tmp_path / "old.ckpt"  # a checkpoint from before the counts were kept still resumes
    del saved["somatize"]["cache"]
    torch.save(saved, old)
    trainer, lg = run(2, ckpt_path=str(old))
    assert result(trainer, lg).cache == {"encoder": {"hits": 64, "misses": 0}}  # from the resume


def test_under_accumulation_losses_are_one_per_step_as_the_somatize_trainers(tmp_path):
    ours, theirs, _ = _twins()
    sgd = _sgd

    options = st.Options(shuffle=False, progress=False, accumulate=2)
    ref = st.Trainer(loss=nn.functional.cross_entropy, optimizer=sgd, epochs=2, options=options)
    ref_result = ref.fit(ours, _loader())  # 4 batches of 16 an epoch: 2 steps an epoch
    lg = LightningGraph(theirs, loss=nn.functional.cross_entropy, optimizer=sgd)
    trainer = _trainer(tmp_path, max_epochs=2, accumulate_grad_batches=2)
    trainer.fit(lg, _loader())
    r = result(trainer, lg)
    assert trainer.global_step == ref_result.steps == 4
    assert len(lg.losses) == 4  # one per optimizer step, not one per batch
    assert r.losses == pytest.approx(ref_result.losses, rel=1e-6)
    _assert_same_state(r.state, ref_result.state)
