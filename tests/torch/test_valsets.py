"""A validation loader with ``drop_last=True`` is never silently evaluated short."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from tests.torch.trainer_helpers import batches, make_graph, plain_copy, quiet


def rows(n: int = 25) -> TensorDataset:
    gen = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen))


def test_evaluate_warns_that_a_drop_last_loader_leaves_examples_out_and_what_it_measured():
    g = make_graph()
    dropping = DataLoader(rows(), batch_size=10, drop_last=True)
    trainer = st.Trainer(loss=F.cross_entropy)
    with pytest.warns(UserWarning, match=r"evaluate\(\)'s data is a DataLoader with drop_last=Tr"):
        got = trainer.evaluate(g, dropping)["loss"]
    # what it measured: the first 20 rows, not the 25 of the set (plain torch)
    x, y = rows().tensors
    with torch.no_grad():
        assert got == pytest.approx(F.cross_entropy(plain_copy(g)(x[:20]), y[:20]).item())
        whole = F.cross_entropy(plain_copy(g)(x), y).item()
    assert trainer.evaluate(g, DataLoader(rows(), batch_size=10))["loss"] == pytest.approx(whole)


def test_fit_names_the_set_and_the_examples_it_leaves_out():
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=quiet(monitor="val_b_loss"),
    )
    val = {"a": batches(1), "b": DataLoader(rows(), batch_size=10, drop_last=True)}
    with pytest.warns(UserWarning) as caught:
        trainer.fit(make_graph(), batches(2), val=val)
    said = {str(w.message) for w in caught}
    assert said == {
        "val set 'b' is a DataLoader with drop_last=True: its last 5 of 25 examples (fewer "
        "than batch_size=10) are never evaluated, so every metric is over 20 examples, not the "
        "set; evaluate with a loader of drop_last=False (keep drop_last=True for the training "
        "loader only)"
    }


@pytest.mark.parametrize(
    ("loader", "limit"),
    [
        (DataLoader(rows(20), batch_size=10, drop_last=True), None),  # whole batches: none left
        (DataLoader(rows(), batch_size=10, drop_last=False), None),
        (DataLoader(rows(), batch_size=10, drop_last=True), 1),  # the limit stops before
    ],
)
def test_no_warning_where_nothing_of_the_set_is_left_out(loader, limit):
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=quiet(limit_val_batches=limit),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.fit(make_graph(), batches(2), val=loader)


def test_a_model_that_carries_state_is_not_warned_for_the_drop_last_its_own_check_asks_for():
    from somatize import Graph
    from tests.torch.test_trainer_carry import Recurrent, data
    from tests.torch.test_trainer_carry_checks import loader, trainer

    val = loader(3, batch_size=2, drop_last=True)  # the fix the Carry's short-batch check names
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer(shuffle=False).fit(Graph.somatize(Recurrent()), data(2), val=val)
        trainer().evaluate(Graph.somatize(Recurrent()), val)
