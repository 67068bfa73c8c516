"""evaluate() and predict() need no optimizer; predict returns outputs in order, in eval mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError


class Net(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, ctx):
        return Done(Opaque(self.drop(self.lin(x))))


def test_evaluate_and_predict_without_an_optimizer():
    torch.manual_seed(0)
    g = Graph.somatize(Net())
    plain = nn.Sequential(g["net"].lin).eval()
    xs = [torch.randn(4, 3) for _ in range(3)]
    ys = [torch.randint(0, 2, (4,)) for _ in range(3)]
    trainer = st.Trainer(loss=F.cross_entropy, metrics={"acc": st.accuracy})
    m = st.module(g).train()
    out = trainer.predict(g, list(zip(xs, ys)))
    assert m.training  # the mode is restored
    assert len(out) == 3
    for o, x in zip(out, xs):
        assert not o.requires_grad
        assert torch.equal(o, plain(x))  # eval mode: dropout off, the same order
    assert [o.shape for o in trainer.predict(g, xs)] == [(4, 2)] * 3  # bare inputs too
    got = trainer.evaluate(g, list(zip(xs, ys)))
    with torch.no_grad():
        want = sum(F.cross_entropy(plain(x), y) for x, y in zip(xs, ys)) / 3
    assert got["loss"] == pytest.approx(float(want))


def test_fit_without_an_optimizer_says_what_to_pass():
    with pytest.raises(SettingError, match="needs an optimizer factory"):
        st.Trainer(loss=F.cross_entropy).fit(
            Graph.somatize(Net()), [(torch.randn(2, 3), torch.tensor([0, 1]))]
        )


def test_predict_over_a_dataloader_of_a_tensordataset_of_inputs_alone():
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    g = Graph.somatize(Net())
    x = torch.randn(10, 3)
    out = st.Trainer().predict(g, DataLoader(TensorDataset(x), batch_size=4))  # [x] batches
    with torch.no_grad():
        assert torch.equal(torch.cat(out), g["net"].lin(x))
