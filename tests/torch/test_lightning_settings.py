"""LightningGraph's optimizer and scheduler factories, called as a LightningModule's
``configure_optimizers`` would: when the Trainer has the model (so a factory may read
``trainer.estimated_stepping_batches``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.torch.lightning import LightningGraph  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [*QUIET, NO_VAL]


class Lin(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def _loader() -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    return DataLoader(TensorDataset(x, x[:, :3].argmax(dim=1)), batch_size=16)


def _trainer(logger=False) -> L.Trainer:
    return L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _one_cycle(trainer: L.Trainer):
    def scheduler(opt):  # Lightning's idiom: the run's length from the Trainer
        steps = trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.5, total_steps=steps)
        return {"scheduler": sched, "interval": "step"}

    return scheduler


class Plain(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.lin(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": _one_cycle(self.trainer)(opt)}


def test_a_scheduler_reading_the_trainer_is_called_when_lightning_configures(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(str(tmp_path), name="csv", version=0)
    trainer = _trainer(logger)
    torch.manual_seed(0)
    lg = LightningGraph(
        Graph.somatize(Lin()),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=_one_cycle(trainer),  # the trainer has no model yet: not called here
    )
    trainer.fit(lg, _loader())
    sched = trainer.lr_scheduler_configs[0].scheduler
    assert sched.total_steps == trainer.global_step == 8
    assert lg.hparams["scheduler_name"] == "OneCycleLR"
    assert lg.hparams["optimizer_name"] == "SGD" and lg.hparams["lr"] == 0.1
    logged = (tmp_path / "csv" / "version_0" / "hparams.yaml").read_text()
    assert "scheduler_name: OneCycleLR" in logged  # what the loggers were given
    plain = Plain()
    _trainer().fit(plain, _loader())
    torch.testing.assert_close(lg.net.lin.lin.weight, plain.lin.weight)


def test_load_from_checkpoint_without_the_graph_names_what_to_pass(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from somatize.errors import SettingError

    lg = LightningGraph(
        Graph.somatize(Lin()),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
    )
    checkpoint = ModelCheckpoint(dirpath=tmp_path)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        callbacks=[checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(lg, _loader())
    path = checkpoint.best_model_path
    # Lightning's habit, Model.load_from_checkpoint(path): the checkpoint holds no code
    with pytest.raises(SettingError) as e:
        LightningGraph.load_from_checkpoint(path)
    message = str(e.value)
    assert "missing g=, loss=:" in message  # (optimizer= only to train on)
    assert "'lin'" in message  # the nodes the graph to build has
    assert "g=g, loss=" in message  # the call to write
    with pytest.raises(SettingError, match="missing loss="):
        LightningGraph.load_from_checkpoint(path, g=Graph.somatize(Lin()))


def test_an_optimizer_or_scheduler_that_is_no_factory_is_named_with_its_type():
    g = Graph.somatize(Lin())
    with pytest.raises(TypeError, match=r"optimizer must be a factory .*, not int; e\.g\."):
        LightningGraph(g, loss=nn.functional.cross_entropy, optimizer=42)
    with pytest.raises(TypeError, match=r"scheduler must be a factory .*, not str; e\.g\."):
        LightningGraph(g, loss=nn.functional.cross_entropy, scheduler="cosine")


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8),
            r"the CosineAnnealingLR's T_max=8 is longer than the run: .* once an epoch .* 2 "
            r"times in max_epochs=2, .* return \{\"scheduler\": sched, \"interval\": \"step\"\}; "
            r"or size it in epochs \(T_max=2\)$",
        ),
        (  # composed: the SequentialLR's last part runs from its milestone (1 + 8 > 2)
            lambda opt: torch.optim.lr_scheduler.SequentialLR(
                opt,
                [
                    torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=1),
                    torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8),
                ],
                milestones=[1],
            ),
            r"the SequentialLR's CosineAnnealingLR's T_max=8 is longer than the run",
        ),
    ],
)
def test_a_plain_scheduler_sized_in_steps_warns_that_it_is_stepped_once_an_epoch(make, said):
    # before: silent, the cosine stepped twice of its 8 (its rate barely decayed)
    lg = LightningGraph(
        Graph.somatize(Lin()),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=make,
    )
    trainer = _trainer()
    with pytest.warns(UserWarning, match=said) as caught:
        trainer.fit(lg, _loader())
    assert [w.filename for w in caught if "longer than the run" in str(w.message)] == [__file__]
    assert trainer.lr_scheduler_configs[0].interval == "epoch"  # stepped as Lightning steps it


@pytest.mark.parametrize(
    "make",
    [
        lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2),  # sized in epochs
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, 5),  # no length to compare
        lambda opt: torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=8),  # a warm-up
        lambda opt: {  # stepped every step: sized in steps as it should be
            "scheduler": torch.optim.lr_scheduler.OneCycleLR(opt, 0.5, total_steps=8),
            "interval": "step",
        },
    ],
)
def test_a_scheduler_that_fits_its_interval_does_not_warn(make):
    lg = LightningGraph(
        Graph.somatize(Lin()),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=make,
    )
    _trainer().fit(lg, _loader())  # (filterwarnings=error: a warning fails the test)
    assert len(lg.losses) == 8
