"""A LightningGraph's training history (``somatize/torch/lightning_steps.py``): its steps'
losses and terms and its epochs' means in ``result(trainer, lg)``, against the somatize
Trainer's on the same data and weights, against what Lightning logs, and across resumes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import somatize.torch as st  # noqa: E402
from somatize.torch.lightning import LightningGraph, result  # noqa: E402
from tests.torch.lightning_graphs import _graph, _lg, _loader, _trainer  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    NO_VAL,
    # a resumed fit checkpoints into its run's directory, as the run it goes on did
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
]


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.3)


def _twins():
    start = st.state(_graph(0))
    ours, theirs = _graph(1), _graph(2)
    st.load_state(ours, start)
    st.load_state(theirs, start)
    return ours, theirs


@pytest.mark.parametrize(
    ("accumulate", "rows", "sizes", "same"),
    [(1, 56, [16, 16, 16, 8], 3), (2, 64, [32, 32], 3), (2, 56, [32, 24], 1)],
    ids=["short-last-batch", "accumulated", "accumulated-short-last-step"],
)
def test_epoch_losses_are_the_somatize_trainers_and_lightnings_train_loss_epoch(
    tmp_path, accumulate, rows, sizes, same
):
    # batches of 16: a short last batch (8), or step (16 + 8), weighs what it holds
    ours, theirs = _twins()
    ref = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=_sgd,
        epochs=3,
        options=st.Options(shuffle=False, progress=False, accumulate=accumulate),
    ).fit(ours, _loader(rows))
    lg = _lg(theirs, optimizer=_sgd)
    trainer = _trainer(tmp_path, max_epochs=3, accumulate_grad_batches=accumulate)
    trainer.fit(lg, _loader(rows))
    r = result(trainer, lg)
    assert len(r.epoch_losses) == len(ref.epoch_losses) == 3
    assert r.epoch_losses == lg.epoch_losses
    # the same steps' losses, bitwise, summed in float64 as the Trainer sums them: the same
    # floats. Lightning's accumulation divides each batch's loss by accumulate_grad_batches,
    # not by its share of the step's examples: a step of 16 + 8 rows trains otherwise, and
    # the runs part after epoch 0
    steps = len(sizes)
    assert r.losses[: same * steps] == ref.losses[: same * steps]
    assert r.epoch_losses[:same] == ref.epoch_losses[:same]
    if same < 3:
        assert r.losses[same * steps :] != pytest.approx(ref.losses[same * steps :])
    for e, value in enumerate(r.epoch_losses):  # weighed by examples, not a mean of steps
        losses = r.losses[e * steps : (e + 1) * steps]
        assert value == pytest.approx(sum(v * n for v, n in zip(losses, sizes)) / rows, rel=1e-12)
    # the last epoch's train_loss_epoch (computed on the device, in float32): the same mean
    assert r.epoch_losses[-1] == pytest.approx(float(trainer.callback_metrics["train_loss_epoch"]))


def test_a_fit_resumed_at_an_epochs_end_has_the_uninterrupted_runs_epoch_losses(tmp_path):
    full = _lg(_graph(0))

    def every():
        return [ModelCheckpoint(tmp_path / "e", save_top_k=-1, filename="{epoch}")]

    _trainer(tmp_path, max_epochs=3, callbacks=every()).fit(full, _loader())
    resumed = _lg(_graph(0))
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=every())
    trainer.fit(resumed, _loader(), ckpt_path=tmp_path / "e" / "epoch=0.ckpt")
    assert len(full.epoch_losses) == 3
    assert result(trainer, resumed).epoch_losses == full.epoch_losses  # epoch 0's: checkpointed


# Lightning's own warning: a DataLoader without state_dict is read again from its start
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch")
def test_an_epoch_resumed_in_its_middle_holds_the_steps_since_the_resume(tmp_path):
    # Lightning keeps no running sums: its train_loss_epoch, and the entry, are over the
    # steps since the resume (here Lightning reads the DataLoader again from its start)
    full = _lg(_graph(0))

    def steps():
        return [ModelCheckpoint(tmp_path / "s", save_top_k=-1, every_n_train_steps=1)]

    _trainer(tmp_path, max_epochs=2, callbacks=steps()).fit(full, _loader(56))
    resumed = _lg(_graph(0))
    trainer = _trainer(tmp_path, max_epochs=2, callbacks=steps())
    trainer.fit(resumed, _loader(56), ckpt_path=tmp_path / "s" / "epoch=1-step=6.ckpt")
    r = result(trainer, resumed)
    assert r.epoch_losses[0] == full.epoch_losses[0]  # the finished epoch: from the checkpoint
    since = r.losses[6:]  # epoch 1's last two steps, of 16 rows each (batches 0 and 1 again)
    assert len(since) == 2
    assert r.epoch_losses[1] == pytest.approx((since[0] * 16 + since[1] * 16) / 32, rel=1e-12)
    assert r.epoch_losses[1] == pytest.approx(float(trainer.callback_metrics["train_loss_epoch"]))
    assert r.epoch_losses[1] != pytest.approx(full.epoch_losses[1])


def test_a_new_run_of_the_same_module_starts_its_epoch_losses_afresh(tmp_path):
    lg = _lg(_graph(0))
    _trainer(tmp_path, max_epochs=2).fit(lg, _loader())
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(lg, _loader())
    assert len(result(trainer, lg).epoch_losses) == 1


def _two_terms(out, y):
    ce = nn.functional.cross_entropy(out, y)
    sq = out.pow(2).mean()
    return {"loss": ce + 0.01 * sq, "ce": ce, "sq": sq}


@pytest.mark.parametrize(("accumulate", "rows"), [(1, 56), (2, 64)], ids=["short-last", "acc"])
def test_terms_and_their_epoch_means_are_the_somatize_trainers(tmp_path, accumulate, rows):
    """``result(trainer, lg).terms`` / ``.epoch_terms`` as ``st.Trainer``'s, bitwise where the
    runs train alike (one batch a step, or accumulated steps of equal batches), and the
    last epoch's means what Lightning logs as ``train_<term>_epoch``."""
    ours, theirs = _twins()
    ref = st.Trainer(
        loss=_two_terms,
        optimizer=_sgd,
        epochs=3,
        options=st.Options(shuffle=False, progress=False, accumulate=accumulate),
    ).fit(ours, _loader(rows))
    lg = LightningGraph(theirs, loss=_two_terms, optimizer=_sgd)
    trainer = _trainer(tmp_path, max_epochs=3, accumulate_grad_batches=accumulate)
    trainer.fit(lg, _loader(rows))
    r = result(trainer, lg)
    assert r.losses == ref.losses and list(r.terms) == ["ce", "sq"]
    assert r.terms == ref.terms == lg.terms  # each step's, bitwise
    assert r.epoch_terms == ref.epoch_terms == lg.epoch_terms
    assert all(len(v) == 3 for v in r.epoch_terms.values())
    for name, values in r.epoch_terms.items():
        logged = float(trainer.callback_metrics[f"train_{name}_epoch"])
        assert values[-1] == pytest.approx(logged, rel=1e-6), name


def test_terms_survive_a_resume_at_an_epochs_end(tmp_path):
    def every():
        return [ModelCheckpoint(tmp_path / "e", save_top_k=-1, filename="{epoch}")]

    full = LightningGraph(_graph(0), loss=_two_terms, optimizer=_sgd)
    _trainer(tmp_path, max_epochs=3, callbacks=every()).fit(full, _loader())
    resumed = LightningGraph(_graph(0), loss=_two_terms, optimizer=_sgd)
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=every())
    trainer.fit(resumed, _loader(), ckpt_path=tmp_path / "e" / "epoch=0.ckpt")
    r = result(trainer, resumed)
    assert r.terms == full.terms and len(r.terms["ce"]) == 12  # epoch 0's: checkpointed
    assert r.epoch_terms == full.epoch_terms
