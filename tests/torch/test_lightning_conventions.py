"""LightningGraph follows st.Trainer's conventions: the same arguments mean the same things."""

from __future__ import annotations

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")

import somatize.torch as st  # noqa: E402
from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.errors import SettingError  # noqa: E402
from somatize.torch.lightning import LightningGraph  # noqa: E402

pytestmark = [
    # lightning 2.6's CombinedLoader uses torch.utils._pytree.LeafSpec, deprecated in the
    # torch we run: every fit warns, whatever the module does (as in test_lightning.py).
    pytest.mark.filterwarnings(
        r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
    ),
    pytest.mark.filterwarnings("ignore:The '.*' does not have many workers"),
]


class Out(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


@pytest.mark.parametrize(
    ("metrics", "match"),
    [
        ({"loss": nn.functional.nll_loss}, "metric name 'loss' is reserved"),
        ({"val_acc": st.accuracy}, "'val_acc' would be evaluated as 'val_val_acc'"),
        ([st.accuracy], "metrics is a dict name → fn, not a list"),
    ],
)
def test_metric_names_are_checked_as_by_the_trainer(metrics, match):
    g = Graph.somatize(Out())
    with pytest.raises(SettingError, match=match):
        LightningGraph(g, loss=nn.functional.cross_entropy, optimizer=sgd, metrics=metrics)
    with pytest.raises(SettingError, match=match):
        st.Trainer(loss=nn.functional.cross_entropy, optimizer=sgd, metrics=metrics)
