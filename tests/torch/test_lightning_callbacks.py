"""Lightning's callbacks and checkpoints with LightningGraph: ModelCheckpoint on somatize
metrics, EarlyStopping, resuming from last, and load_from_checkpoint (what it restores
and what it refuses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402

import somatize.torch as st  # noqa: E402
from somatize import Graph  # noqa: E402
from somatize.errors import CheckpointError  # noqa: E402
from somatize.torch.lightning import LightningGraph, result  # noqa: E402
from tests.torch.lightning_graphs import (  # noqa: E402
    SGD,
    Hidden,
    Out,
    _assert_same_state,
    _graph,
    _lg,
    _loader,
    _tensors,
    _trainer,
)
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    NO_VAL,  # fitting without validation data is a normal run here, as in the Trainer
]


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


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_resuming_into_a_graph_frozen_otherwise_names_the_node_and_the_freeze_call(tmp_path):
    def run(g, epochs, **kw):
        save = ModelCheckpoint(tmp_path / "ckpt", save_last=True)
        _trainer(tmp_path, max_epochs=epochs, callbacks=[save]).fit(_lg(g), _loader(), **kw)

    run(_graph(0).freeze("hidden"), 1)
    # (before: Lightning's bare ValueError from the optimizer, "loaded state dict contains a
    # parameter group that doesn't match the size of optimizer's group")
    with pytest.raises(
        CheckpointError, match=r"node 'hidden' frozen, which this graph trains"
    ) as e:
        run(_graph(0), 2, ckpt_path="last")
    assert "(g.freeze('hidden')) before resuming" in str(e.value)
    assert "LightningGraph.load_from_checkpoint(path, g=g" in str(e.value)
    run(_graph(0).freeze("hidden"), 2, ckpt_path="last")  # rebuilt as it was trained: resumes


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
