"""A Lightning script and its port to st.Trainer by docs/trainer.md's "Coming from
Lightning" table, run side by side on the same weights and the same batches: AdamW with a
OneCycleLR stepped every optimizer step, gradient_clip_val, accumulate_grad_batches,
bf16-mixed, val_check_interval (a fraction), limit_train_batches, ModelCheckpoint's
top-k by val_loss and EarlyStopping. What the table claims equal is compared: the losses
of every step, when each evaluation falls and what it gives, the checkpoint chosen, where
the run stops, the final weights and the test of the best checkpoint."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint  # noqa: E402

import somatize.torch as st  # noqa: E402
from tests.torch.lightning_quiet import QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
]

SEED, MAX_LR, EPOCHS = 0, 0.2, 12


def _data():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(400, 16, generator=gen)
    y = x[:, :4].argmax(1)
    noisy = torch.rand(400, generator=gen) < 0.3  # labels it can only overfit
    y = torch.where(noisy, torch.randint(0, 4, (400,), generator=gen), y)
    train = DataLoader(TensorDataset(x[:240], y[:240]), batch_size=12, shuffle=True)  # 20
    val = DataLoader(TensorDataset(x[240:320], y[240:320]), batch_size=32)  # 32 + 32 + 16
    test = DataLoader(TensorDataset(x[320:], y[320:]), batch_size=32)
    return train, val, test


def _net():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


class Lit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = _net()
        self.losses: list[float] = []

    def forward(self, x):
        return self.net(x)

    def predict_step(self, batch, i):
        return self.net(batch[0])

    def training_step(self, batch, i):
        loss = F.cross_entropy(self.net(batch[0]), batch[1])
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, i):
        out = self.net(batch[0])
        self.log("val_loss", F.cross_entropy(out, batch[1]))
        self.log("val_acc", (out.argmax(-1) == batch[1]).float().mean())

    test_step = validation_step

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        total = self.trainer.estimated_stepping_batches
        one_cycle = torch.optim.lr_scheduler.OneCycleLR(opt, MAX_LR, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": one_cycle, "interval": "step"}}


class TrainerOrder(Callback):
    """The batches in the order st.Trainer(seed=SEED) reads them (docs/trainer.md's seeds)."""

    def on_train_epoch_start(self, trainer, pl_module):
        loader, e = trainer.train_dataloader, trainer.current_epoch
        loader.sampler.generator = torch.Generator().manual_seed(SEED * 1_000_003 + e)
        loader.generator = torch.Generator().manual_seed(SEED * 1_000_003 + e + 500_009)


class Evaluations(Callback):
    def __init__(self):
        self.at: list[tuple[int, float]] = []

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.at.append((trainer.global_step, float(trainer.callback_metrics["val_loss"])))


def test_a_lightning_script_and_its_port_train_alike(tmp_path):
    train, val, test = _data()
    lit, evaluations = Lit(), Evaluations()
    keep = ModelCheckpoint(tmp_path / "lit", monitor="val_loss", save_top_k=2, save_last=True)
    stop = EarlyStopping("val_loss", patience=2)
    lightning = L.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        precision="bf16-mixed",
        gradient_clip_val=1.0,
        accumulate_grad_batches=2,
        val_check_interval=0.5,
        limit_train_batches=16,
        callbacks=[keep, stop, TrainerOrder(), evaluations],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    lightning.fit(lit, train, val)
    stopped_at = lightning.global_step

    g = _net()  # a plain nn.Module, the same weights (_net seeds them)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(
            opt, MAX_LR, total_steps=trainer.planned_steps(train)
        ),
        epochs=EPOCHS,
        metrics={"acc": st.accuracy},
        checkpoint=st.Checkpointing(tmp_path / "st", best=2),
        pruner=st.Patience("val_loss", patience=2),
        seed=SEED,
        options=st.Options(
            precision="bf16",
            clip_grad_norm=1.0,
            accumulate=2,
            eval_every_steps=4,  # 16 batches / 2 a step = 8 steps an epoch, 0.5 of it
            limit_train_batches=16,
            progress=False,
        ),
    )
    result = trainer.fit(g, train, val=val)

    assert trainer.planned_steps(train) == lightning.estimated_stepping_batches == 8 * EPOCHS
    assert result.pruned and stop.stopped_epoch > 0  # both stopped early...
    assert result.steps == stopped_at < 8 * EPOCHS  # ...after the same step
    # a step's loss is its two batches' mean (Lightning: each batch's); bf16 forward passes
    # in float32 sums, the mean taken in another order: float32's rounding apart
    batches = torch.tensor(lit.losses, dtype=torch.float64).view(-1, 2).mean(1)
    torch.testing.assert_close(
        torch.tensor(result.losses, dtype=torch.float64), batches, rtol=1e-6, atol=1e-6
    )
    assert [m["step"] for m in result.metrics] == [s for s, _ in evaluations.at]
    torch.testing.assert_close(  # val_loss: float32 (Lightning) against float64 (here)
        torch.tensor([m["val_loss"] for m in result.metrics], dtype=torch.float64),
        torch.tensor([v for _, v in evaluations.at], dtype=torch.float64),
        rtol=1e-6,
        atol=1e-6,
    )
    best = st.load_checkpoint(result.best_checkpoint)
    assert best["step"] == torch.load(keep.best_model_path, weights_only=True)["global_step"]
    top_k = {torch.load(p, weights_only=True)["global_step"] for p in keep.best_k_models}
    assert {step for _, step in st.load_checkpoint(result.checkpoint)["ranked"]} == top_k
    assert len(top_k) == 2
    for name, weight in lit.net.state_dict().items():  # the same float32 steps
        torch.testing.assert_close(result.state[name], weight, rtol=0, atol=1e-6)

    tested = lightning.test(lit, test, ckpt_path="best", verbose=False)[0]
    g.load_state_dict(best["model"])  # (a plain module: st.load_state is a graph's)
    ours = trainer.evaluate(g, test)
    assert ours["loss"] == pytest.approx(tested["val_loss"], rel=1e-6)
    assert ours["acc"] == pytest.approx(tested["val_acc"], abs=1e-6)
    predicted = torch.cat(lightning.predict(lit, test, ckpt_path="best"))
    assert torch.equal(torch.cat(trainer.predict(g, test)).argmax(-1), predicted.argmax(-1))
