"""LightningGraph with state carried from batch to batch (st.Carry): the checks and resets
the somatize Trainer makes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

import somatize.torch as st  # noqa: E402
from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.torch.lightning import LightningGraph  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [*QUIET, NO_VAL]


class Recurrent(Node):
    """A GRU over windows, its hidden state carried from one batch to the next."""

    def __init__(self) -> None:
        self.rnn = nn.GRU(4, 8, batch_first=True)
        self.out = nn.Linear(8, 3)
        self.hidden = st.Carry()
        self.fresh: list[bool] = []  # per call: did it start from None?

    def forward(self, x, ctx):
        self.fresh.append(self.hidden.value is None)
        o, h = self.rnn(x, self.hidden.value)
        self.hidden.set(h)
        return Done(Opaque(self.out(o[:, -1])))


def _data(n: int = 64) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(n, 5, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)
    )


def _lg(node: Node) -> LightningGraph:
    return LightningGraph(
        Graph.somatize(node),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
    )


def _trainer(**kw) -> L.Trainer:
    settings = dict(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**settings, **kw})


def _carry_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "st.Carry" in str(w.message)]


def test_a_shuffled_dataloader_warns_as_under_the_somatize_trainer():
    with warnings.catch_warnings(record=True) as shuffled:
        warnings.simplefilter("always")
        _trainer().fit(_lg(Recurrent()), DataLoader(_data(), batch_size=16, shuffle=True))
    (message,) = _carry_warnings(shuffled)
    assert "node 'recurrent' (.hidden)" in message
    assert "shuffle=True" in message and "DataLoader(..., shuffle=False)" in message
    with warnings.catch_warnings(record=True) as in_order:
        warnings.simplefilter("always")
        _trainer().fit(_lg(Recurrent()), DataLoader(_data(), batch_size=16))
    assert _carry_warnings(in_order) == []


def test_predict_and_each_evaluated_loader_start_from_no_carried_state():
    node = Recurrent()
    lg = _lg(node)
    trainer = _trainer(num_sanity_val_steps=0)
    two = [DataLoader(_data(32), batch_size=16), DataLoader(_data(48), batch_size=16)]
    trainer.fit(lg, DataLoader(_data(), batch_size=16), two)
    # each validation loader starts afresh, as each of st.Trainer's val sets does
    assert node.fresh[4:] == [True, False, True, False, False]
    node.fresh.clear()
    predicted = trainer.predict(lg, DataLoader(_data(40), batch_size=10))  # not training's 16
    assert node.fresh == [True, False, False, False]
    ours = st.Trainer().predict(lg.graph, DataLoader(_data(40), batch_size=10))
    for a, b in zip(predicted, ours, strict=True):
        torch.testing.assert_close(a, b)
    node.fresh.clear()
    trainer.test(lg, two)
    assert node.fresh == [True, False, True, False, False]
