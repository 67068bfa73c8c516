"""lg.history (lightning_history.py): what LightningGraph's validations record, against
st.Trainer's evaluation and a plain LightningModule's logged values."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

import somatize.torch as st  # noqa: E402
from somatize import Done, Graph, Node, Opaque, Recorder  # noqa: E402
from somatize.torch.lightning import LightningGraph, Watch, result  # noqa: E402
from somatize.watchers import EpochEnd, StepEnd  # noqa: E402
from tests.torch.lightning_quiet import QUIET  # noqa: E402

pytestmark = QUIET


class Hidden(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(64, 16)

    def forward(self, x, ctx):
        h = torch.relu(self.lin(x))
        return Done(Opaque(h), metrics={"active": (h > 0).float().mean()})


class Out(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(16, 10)

    def forward(self, h, ctx):
        return Done(Opaque(self.lin(h)))


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Hidden() >> Out())


def loader(n: int, seed: int, batch: int) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def lightning(**kw) -> L.Trainer:
    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    return L.Trainer(**{**settings, **kw})


def lg_of(g: Graph) -> LightningGraph:
    return LightningGraph(
        g,
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"acc": st.accuracy},
    )


def test_validation_node_metrics_are_in_the_history_the_result_and_watch():
    rec = Recorder()
    lg = lg_of(graph())
    val = loader(38, 1, batch=16)  # 16, 16, 6: a smaller last batch weighs less
    trainer = lightning(max_epochs=2, callbacks=[Watch([rec])])
    trainer.fit(lg, loader(64, 0, batch=16), val)

    records = result(trainer, lg).metrics
    assert records == lg.history and len(records) == 2
    last = records[-1]
    assert list(last) == ["step", "epoch", "val_loss", "val_acc", "val_hidden/active"]
    # what Lightning logged (its own example-weighted mean, in float32)
    logged = trainer.callback_metrics
    for name in ("val_loss", "val_acc", "val_hidden/active"):
        assert last[name] == pytest.approx(float(logged[name]), rel=1e-6), name
    # what the somatize Trainer evaluates on the same weights, under the same names
    evaluated = st.Trainer(loss=F.cross_entropy, metrics={"acc": st.accuracy}).evaluate(
        lg.graph, val
    )
    assert set(evaluated) == {"loss", "acc", "hidden/active"}
    for name, value in evaluated.items():
        assert last[f"val_{name}"] == pytest.approx(value, rel=1e-12), name
    epochs = rec.of(EpochEnd)
    assert [e.metrics["val_hidden/active"] for e in epochs] == [
        r["val_hidden/active"] for r in records
    ]


class Plain(L.LightningModule):
    """graph()'s network as a plain LightningModule (the same initial weights)."""

    def __init__(self) -> None:
        super().__init__()
        g = graph()
        self.hidden, self.out = g["hidden"].lin, g["out"].lin

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))

    def training_step(self, batch, i):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), batch_size=len(x))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_under_bf16_val_loss_is_lightnings_and_the_somatize_trainers():
    train, val = loader(64, 0, batch=16), loader(38, 1, batch=16)
    plain = Plain()
    done = lightning(max_epochs=1, precision="bf16-mixed")
    done.fit(plain, train, val)
    lg = lg_of(graph())
    lightning(max_epochs=1, precision="bf16-mixed").fit(lg, train, val)
    assert torch.equal(lg.graph["out"].lin.weight, plain.out.weight)

    bf16 = st.Trainer(loss=F.cross_entropy, options=st.Options(precision="bf16", progress=False))
    evaluated = bf16.evaluate(lg.graph, val)["loss"]
    want = float(done.callback_metrics["val_loss"])
    assert lg.history[-1]["val_loss"] == pytest.approx(want, rel=1e-6, abs=0)
    assert evaluated == pytest.approx(want, rel=1e-6, abs=0)


def test_results_say_what_the_last_validation_counted_so_weighted_metrics_weighs_by_it(
    tmp_path,
):
    import warnings

    from somatize.torch import federated as fl

    results = []
    for n_val in (38, 5):  # unequal validation sets, equal training sets
        lg = lg_of(graph())
        trainer = lightning(max_epochs=1)
        trainer.fit(lg, loader(64, 0, batch=16), loader(n_val, n_val, batch=16))
        results.append(result(trainer, lg))
    assert [r.val_examples for r in results] == [{"val_": 38}, {"val_": 5}]
    assert [r.num_examples for r in results] == [64, 64]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (it warned, and weighed by the 64 training examples)
        pooled = fl.weighted_metrics(results)
    losses = [r.metrics[-1]["val_loss"] for r in results]
    assert pooled["val_loss"] == pytest.approx((38 * losses[0] + 5 * losses[1]) / 43, rel=1e-12)
    # what st.Trainer's results say for the same validation sets
    trainer = st.Trainer(
        loss=F.cross_entropy, epochs=1, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)
    )
    own = trainer.fit(graph(), loader(64, 0, batch=16), val=loader(38, 38, batch=16))
    assert own.val_examples == results[0].val_examples
    # kept across a checkpoint: a resumed fit's result still says it
    lg = lg_of(graph())
    first = lightning(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    first.fit(lg, loader(64, 0, batch=16), loader(38, 38, batch=16))
    resumed_lg = lg_of(graph())
    resumed = lightning(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    with warnings.catch_warnings():  # (Lightning's: the directory holds the first's)
        warnings.filterwarnings("ignore", "Checkpoint directory .* exists", UserWarning)
        resumed.fit(
            resumed_lg,
            loader(64, 0, batch=16),
            loader(38, 38, batch=16),
            ckpt_path=first.checkpoint_callback.best_model_path,
        )
    assert result(resumed, resumed_lg).val_examples == {"val_": 38}


class Positives:
    """A metric object (reset/update/compute): the share of targets above 4, over a set."""

    def reset(self) -> None:
        self.hits, self.seen = 0, 0

    def update(self, output, target) -> None:
        self.hits += int((target > 4).sum())
        self.seen += len(target)

    def compute(self) -> float:
        return self.hits / self.seen


def scaled(n: int, seed: int, batch: int, by: float) -> DataLoader:
    """loader(n, seed, batch)'s examples times ``by``, labelled alike."""
    x, y = loader(n, seed, batch).dataset.tensors
    return DataLoader(TensorDataset(x * by, (y + 3) % 10), batch_size=batch)


def lg_with_object(g: Graph) -> LightningGraph:
    return LightningGraph(
        g,
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"acc": st.accuracy, "pos": Positives()},
    )


def test_several_validation_loaders_are_recorded_per_set_under_lightnings_names():
    rec = Recorder()
    clean, noisy = loader(38, 1, batch=16), scaled(5, 2, batch=16, by=100.0)
    lg = lg_with_object(graph())
    trainer = lightning(max_epochs=2, callbacks=[Watch([rec])])
    trainer.fit(lg, loader(64, 0, batch=16), [clean, noisy])

    names = ["loss", "acc", "pos", "hidden/active"]
    sets = {0: clean, 1: noisy}
    last = lg.history[-1]
    assert list(last) == ["step", "epoch"] + [
        f"val_{n}/dataloader_idx_{i}" for i in sets for n in names
    ]
    for name in list(last)[2:]:  # each set's value is the one Lightning logged for it
        assert last[name] == pytest.approx(float(trainer.callback_metrics[name]), rel=1e-6), name
    # ... and what the somatize Trainer evaluates on that set alone
    own = st.Trainer(loss=F.cross_entropy, metrics={"acc": st.accuracy, "pos": Positives()})
    for i, data in sets.items():
        for name, value in own.evaluate(lg.graph, data).items():
            assert last[f"val_{name}/dataloader_idx_{i}"] == pytest.approx(value, rel=1e-12)
    assert last["val_loss/dataloader_idx_1"] > 10 * last["val_loss/dataloader_idx_0"]

    r = result(trainer, lg)
    assert r.metrics == lg.history and len(r.metrics) == 2
    assert r.monitor == "val_loss/dataloader_idx_0"  # the first loader's, when nothing says
    assert r.best == min(m["val_loss/dataloader_idx_0"] for m in lg.history)
    assert r.val_examples == {
        f"val_{n}/dataloader_idx_{i}": count for i, count in ((0, 38), (1, 5)) for n in names
    }
    assert [e.metrics for e in rec.of(EpochEnd)] == lg.history


def test_several_validation_loaders_weigh_by_each_sets_size_and_survive_a_resume(tmp_path):
    import warnings

    from lightning.pytorch.callbacks import ModelCheckpoint

    from somatize.torch import federated as fl

    def fit(epochs: int, **kw) -> tuple[L.Trainer, LightningGraph]:
        lg = lg_with_object(graph())
        best = ModelCheckpoint(tmp_path, monitor="val_loss/dataloader_idx_1", save_last=True)
        trainer = lightning(max_epochs=epochs, enable_checkpointing=True, callbacks=[best])
        val = [loader(38, 1, batch=16), scaled(5, 2, batch=16, by=100.0)]
        with warnings.catch_warnings():  # (Lightning's: the directory holds the first's)
            warnings.filterwarnings("ignore", "Checkpoint directory .* exists", UserWarning)
            trainer.fit(lg, loader(64, 0, batch=16), val, **kw)
        return trainer, lg

    first, first_lg = fit(1)
    trainer, lg = fit(2, ckpt_path="last")
    assert [m["epoch"] for m in lg.history] == [0, 1]
    assert lg.history[0] == first_lg.history[0]
    r = result(trainer, lg)
    assert r.monitor == "val_loss/dataloader_idx_1"  # the ModelCheckpoint's, as Lightning ranks
    assert r.best == pytest.approx(min(m[r.monitor] for m in lg.history), rel=1e-6)
    assert r.val_examples["val_acc/dataloader_idx_1"] == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every metric says how many examples it averaged
        pooled = fl.weighted_metrics([r, result(first, first_lg)])
    for name in ("val_loss/dataloader_idx_0", "val_pos/dataloader_idx_1"):
        assert pooled[name] == pytest.approx((r.metric(name) + first_lg.history[0][name]) / 2)


def test_validate_after_fit_is_kept_apart_from_the_runs_history_and_best():
    lg = lg_of(graph())
    trainer = lightning(max_epochs=2)
    trainer.fit(lg, loader(64, 0, batch=16), loader(38, 1, batch=16))
    before = result(trainer, lg)

    other = loader(20, 7, batch=16)
    (logged,) = trainer.validate(lg, other, verbose=False)
    after = result(trainer, lg)
    assert len(lg.history) == 2 and after.metrics == before.metrics
    assert (after.monitor, after.best) == (before.monitor, before.best)
    assert after.val_examples == before.val_examples == {"val_": 38}
    (record,) = lg.validated
    assert record["step"] == trainer.global_step
    assert {k: v for k, v in record.items() if k.startswith("val_")} == pytest.approx(
        {k: float(v) for k, v in logged.items()}, rel=1e-6
    )
    evaluated = st.Trainer(loss=F.cross_entropy).evaluate(lg.graph, other)["loss"]
    assert record["val_loss"] == pytest.approx(evaluated, rel=1e-12)


def test_a_loss_of_several_terms_logs_each_in_training_and_validation():
    """``self.log("train_ce", ...)`` of a LightningModule's training_step: here, a loss
    function's dict; its terms are in every step's log and in each validation's record."""

    def loss(out, y):
        ce = F.cross_entropy(out, y)
        return {"loss": ce + 0.01 * out.pow(2).mean(), "ce": ce, "sq": out.pow(2).mean()}

    class Logged(L.Callback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.steps.append({k: float(v) for k, v in trainer.logged_metrics.items()})

    logged = Logged()
    lg = LightningGraph(
        graph(),
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"acc": st.accuracy},
    )
    val = loader(38, 1, batch=16)
    rec = Recorder()
    trainer = lightning(max_epochs=2, callbacks=[logged, Watch([rec])], log_every_n_steps=1)
    trainer.fit(lg, loader(64, 0, batch=16), val)
    assert len(logged.steps) == 8
    for step in logged.steps:
        assert {"train_loss", "train_ce", "train_sq"} <= set(step)
        assert step["train_loss"] == pytest.approx(step["train_ce"] + 0.01 * step["train_sq"])
    told = rec.of(StepEnd)  # Watch tells the somatize watchers the same terms
    assert [dict(e.terms) for e in told] == [
        {"ce": s["train_ce"], "sq": s["train_sq"]} for s in logged.steps
    ]
    last = result(trainer, lg).metrics[-1]
    assert list(last) == ["step", "epoch", "val_loss", "val_ce", "val_sq", "val_acc",
                          "val_hidden/active"]  # fmt: skip
    assert last["val_ce"] == pytest.approx(float(trainer.callback_metrics["val_ce"]), rel=1e-6)
    evaluated = st.Trainer(loss=loss, metrics={"acc": st.accuracy}).evaluate(lg.graph, val)
    for name, value in evaluated.items():  # the somatize Trainer's names and values
        assert last[f"val_{name}"] == pytest.approx(value, rel=1e-12), name


def test_a_term_named_as_a_metric_is_refused_in_validation():
    from somatize.errors import SettingError

    def loss(out, y):
        return {"loss": F.cross_entropy(out, y), "acc": st.accuracy(out, y)}

    lg = LightningGraph(graph(), loss=loss, metrics={"acc": st.accuracy})
    with pytest.raises(SettingError, match=r"term 'acc' has the name of the metric 'acc' of Li"):
        lightning().validate(lg, loader(16, 1, batch=16), verbose=False)


def test_a_term_given_on_some_steps_only_is_refused_naming_it_and_a_new_fit_starts_afresh():
    """As st.Trainer (term_names.py): a fit's first step fixes its terms; a step leaving one
    out is a SettingError naming it, before its epoch's mean mixes steps without it."""
    from somatize.errors import SettingError

    calls = []

    def loss(out, y):
        calls.append(1)
        ce = F.cross_entropy(out, y)
        got = {"loss": ce, "ce": ce}
        if len(calls) == 1 or len(calls) > 4:  # the aux term on the first step, then none
            got["aux"] = out.pow(2).mean()
        return got

    lg = LightningGraph(graph(), loss=loss, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(SettingError, match=r"terms changed at step 2: it gave no 'aux'"):
        lightning(max_epochs=1).fit(lg, loader(64, 0, batch=16), loader(16, 1, batch=16))
    calls[:] = [1, 1, 1, 1]  # a new fit: its first step (with aux) fixes its own terms
    trainer = lightning(max_epochs=1)
    trainer.fit(lg, loader(64, 0, batch=16), loader(16, 1, batch=16))
    assert trainer.global_step == 4 and "train_aux" in trainer.logged_metrics


def test_a_validation_whose_batches_give_other_terms_is_refused_naming_them():
    """As st.Trainer's evaluate: a loader's first batch fixes the terms of its evaluation."""
    from somatize.errors import SettingError

    def by_size(out, y):  # aux only for batches of 16 rows
        ce = F.cross_entropy(out, y)
        return {"loss": ce, "ce": ce, **({"aux": 2 * ce} if len(y) == 16 else {})}

    lg = LightningGraph(graph(), loss=by_size, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(SettingError, match=r"changed between two batches of an evaluation: it "
                       r"gave no 'aux', which it did"):  # fmt: skip
        lightning().validate(lg, loader(20, 1, batch=16), verbose=False)  # 16 rows, then 4
    (logged,) = lightning().validate(lg, loader(32, 1, batch=16), verbose=False)
    assert logged["val_aux"] == pytest.approx(2 * logged["val_ce"], rel=1e-6)
