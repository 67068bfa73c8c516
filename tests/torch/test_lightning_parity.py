"""LightningGraph against the plain st.Trainer's recent rules and a hand-written
LightningModule with the same weights: metric names, parameter groups, caching,
resuming, precision."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.errors import SettingError  # noqa: E402
from somatize.torch.lightning import LightningGraph  # noqa: E402
from tests.torch.lightning_quiet import QUIET  # noqa: E402

pytestmark = [*QUIET]


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)), metrics={"conf": torch.tensor(0.25)})


def _loader() -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=gen)
    return DataLoader(TensorDataset(x, x[:, :3].argmax(dim=1)), batch_size=16)


def _trainer(**kw) -> L.Trainer:
    kw = {"max_epochs": 1, "enable_checkpointing": False, "logger": False, **kw}
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def test_a_metric_named_as_a_nodes_metric_is_refused_as_the_trainer_refuses_it():
    # the node's 0.25 and the metric's 0.75 were both logged as val_head/conf: Lightning
    # logged their mean, the history the metric's, the node's value was lost
    lg = LightningGraph(
        Graph.somatize(Head()),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"head/conf": lambda out, y: torch.tensor(0.75)},
    )
    with pytest.raises(SettingError, match=r"'head/conf'.*node 'head'.*'head_conf'"):
        _trainer().fit(lg, _loader(), _loader())
    with pytest.raises(SettingError, match=r"LightningGraph\(metrics=\.\.\.\)"):
        _trainer().validate(lg, _loader())


def test_a_metric_function_giving_one_number_per_example_names_its_own_fix():
    # it said to report a scalar in Done(..., metrics=...): a node's metrics, not this
    lg = LightningGraph(
        Graph.somatize(Head()),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"acc": lambda out, y: (out.argmax(dim=1) == y).float()},
    )
    with pytest.raises(TypeError, match=r"metric 'acc' is a Tensor of shape \(16,\)") as e:
        _trainer().validate(lg, _loader())
    assert "metrics['acc'] return one number per batch" in str(e.value)
    assert ".mean()" in str(e.value)
    assert "Done(" not in str(e.value)


class Body(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(Opaque(torch.relu(self.lin(x))))


class Out(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.lin(h)))


class PlainTwo(L.LightningModule):
    """The same two layers, written by hand, at the same two rates."""

    def __init__(self, state) -> None:
        super().__init__()
        self.body, self.out = nn.Linear(4, 4), nn.Linear(4, 3)
        for name, layer in (("body", self.body), ("out", self.out)):
            layer.weight.data.copy_(state[f"{name}.lin.weight"])
            layer.bias.data.copy_(state[f"{name}.lin.bias"])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.out(torch.relu(self.body(x))), y)

    def configure_optimizers(self):
        return _two_rates(self.body, self.out)


def _two_rates(body: nn.Module, out: nn.Module):
    opt = torch.optim.SGD(
        [{"params": list(body.parameters()), "lr": 0.01}, {"params": list(out.parameters())}],
        lr=0.1,
    )
    return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no")
def test_two_parameter_groups_match_a_hand_written_module_and_learning_rate_monitor(tmp_path):
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger

    import somatize.torch as st
    from somatize import Recorder
    from somatize.torch.lightning import Watch
    from somatize.watchers import StepEnd

    torch.manual_seed(0)
    g = Graph.somatize(Body() >> Out())
    plain = PlainTwo(st.state(g))
    net = st.module(g)
    grouped = _two_rates(net.body, net.out)
    lg = LightningGraph(
        g,
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: grouped["optimizer"],
        scheduler=lambda opt: grouped["lr_scheduler"],
    )
    seen, monitors = Recorder(), [LearningRateMonitor("step"), LearningRateMonitor("step")]
    how = {"max_epochs": 2, "log_every_n_steps": 1}
    ours = _trainer(callbacks=[monitors[0], Watch([seen])], logger=CSVLogger(tmp_path), **how)
    ours.fit(lg, _loader())
    theirs = _trainer(callbacks=[monitors[1]], logger=CSVLogger(tmp_path / "plain"), **how)
    theirs.fit(plain, _loader())
    assert monitors[0].lrs == monitors[1].lrs
    assert monitors[0].lrs["lr-SGD/pg2"] == [0.1, 0.1, 0.05, 0.05]
    assert [e.lrs for e in seen.of(StepEnd)] == list(
        zip(monitors[0].lrs["lr-SGD/pg1"], monitors[0].lrs["lr-SGD/pg2"], strict=True)
    )
    assert torch.equal(st.state(g)["body.lin.weight"], plain.body.weight.detach())
    assert torch.equal(st.state(g)["out.lin.weight"], plain.out.weight.detach())
