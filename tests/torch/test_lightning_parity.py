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
    kw = {"max_epochs": 1, "enable_checkpointing": False, **kw}
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
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
