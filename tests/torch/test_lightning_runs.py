"""A ``LightningGraph``'s record of its run, found wrong by an outside audit: a second fit
on the same module (or a fine-tune after ``load_from_checkpoint``) counted the earlier
fit's losses and examples; ``trainer.test(..., ckpt_path="best")`` rewound the record; and
the smaller ones — a one-tensor batch to predict, a factory returning no optimizer,
Lightning's ``lr_find``, an early stop at epoch 0, the frozen and cached hparams."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402

from somatize.errors import SettingError  # noqa: E402
from somatize.torch.lightning import result  # noqa: E402
from tests.torch.lightning_graphs import _graph, _lg, _loader, _tensors, _trainer  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    NO_VAL,
    # frozen nodes are in eval mode at the start of training on purpose; Lightning says so
    pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode"),
]


def test_a_second_fit_with_a_new_trainer_is_a_run_of_its_own(tmp_path):
    lg = _lg(_graph())
    _trainer(tmp_path, max_epochs=2).fit(lg, _loader(64))
    again = _trainer(tmp_path, max_epochs=1)
    again.fit(lg, _loader(32))  # a fine-tune on other data
    r = result(again, lg)
    assert r.num_examples == 32 and r.steps == 2 and len(r.losses) == 2


def test_the_same_trainer_going_on_keeps_counting_the_whole_run(tmp_path):
    g = _graph().freeze("hidden").cache("hidden", per="example")
    lg = _lg(g)
    t = _trainer(tmp_path, max_epochs=1)
    t.fit(lg, _loader(64))
    t.fit_loop.max_epochs = 2
    t.fit(lg, _loader(64))
    r = result(t, lg)
    assert r.steps == 8 and len(r.losses) == 8 and r.num_examples == 64
    assert r.cache == {"hidden": {"hits": 64, "misses": 64}}  # both fits' lookups


def test_testing_or_predicting_from_the_best_checkpoint_leaves_the_run_as_it_was(tmp_path):
    g = _graph().freeze("hidden").cache("hidden", per="example")
    lg = _lg(g)
    best = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss", mode="max")
    t = _trainer(tmp_path, max_epochs=3, callbacks=[best])
    t.fit(lg, _loader(64), _loader(32, seed=1))
    before = result(t, lg)
    t.test(lg, _loader(32, seed=1), ckpt_path="best")
    t.predict(lg, _loader(32, seed=2))
    after = result(t, lg)
    assert (after.steps, after.losses, after.metrics) == (
        before.steps,
        before.losses,
        before.metrics,
    )
    assert after.cache == before.cache  # nothing test or predict looked up is counted


def test_predict_takes_the_one_tensor_batches_of_a_tensor_dataset(tmp_path):
    lg = _lg(_graph())
    x, _ = _tensors(32)
    out = _trainer(tmp_path).predict(lg, DataLoader(TensorDataset(x), batch_size=16))
    assert [tuple(o.shape) for o in out] == [(16, 3), (16, 3)]


def test_a_factory_that_returns_no_optimizer_is_refused_as_by_the_trainer():
    with pytest.raises(SettingError, match="the optimizer factory returned list"):
        _lg(_graph(), optimizer=lambda ps: [torch.optim.SGD(ps, lr=0.1)])


def test_a_rate_set_in_hparams_by_lr_find_is_the_one_the_fit_uses(tmp_path):
    """Lightning's ``lr_find(update_attr=True)`` writes its suggestion to ``hparams.lr``:
    the factory's rates are scaled to it (it was overwritten, and dropped silently)."""
    lg = _lg(_graph(), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    lg.hparams.lr = 0.02  # what lr_find writes
    t = _trainer(tmp_path, max_epochs=1)
    t.fit(lg, _loader(32))
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.02)
    assert lg.hparams.lr == pytest.approx(0.02)


def test_an_early_stop_at_epoch_zero_gives_the_callbacks_reason(tmp_path):
    stop = EarlyStopping("val_loss", stopping_threshold=100.0)
    t = _trainer(tmp_path, max_epochs=5, callbacks=[stop])
    lg = _lg(_graph())
    t.fit(lg, _loader(64), _loader(32, seed=1))
    r = result(t, lg)
    assert r.pruned and r.steps == 4
    assert r.pruned_reason == stop.stopping_reason_message and "threshold" in r.pruned_reason


def test_the_frozen_and_cached_hparams_are_those_of_the_fit(tmp_path):
    g = _graph()
    lg = _lg(g)
    g.freeze("hidden").cache("hidden", per="example")  # after the module was made
    _trainer(tmp_path, max_epochs=1).fit(lg, _loader(32))
    assert lg.hparams.frozen == ["hidden"] and lg.hparams.cached == ["hidden"]
    g.cache("hidden", False).freeze("hidden", False)
    _trainer(tmp_path, max_epochs=1).fit(lg, _loader(32))
    assert lg.hparams.frozen == [] and lg.hparams.cached == []
