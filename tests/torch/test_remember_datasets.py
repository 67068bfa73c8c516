"""st.remember keys a client's Subset of a TensorDataset by content (a federated task)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque
from somatize.errors import ValueConversionError
from somatize.torch import federated as fl


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def client(global_state, task):
    rows, seed = task
    torch.default_generator.manual_seed(0)
    g = Graph.somatize(Linear())
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=1,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, DataLoader(rows, batch_size=4, shuffle=True))


def dataset(shift: float = 0.0) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(30, 4, generator=gen) + shift, torch.arange(30) % 3)


def test_a_subset_is_keyed_by_its_dataset_and_indices(tmp_path):
    """Subset(train_ds, parts[c]) is what a PyTorch user hands each client; it was refused
    ("an object of type ...Subset, which cannot enter the run's key")."""
    train = st.remember(client, keeper=DiskKeeper(tmp_path))
    state = st.state(Graph.somatize(Linear()))
    ds, rows = dataset(), [1, 4, 7, 9]
    key = train.key(state, (Subset(ds, rows), 0))
    for same in (rows, np.array(rows), torch.tensor(rows), [np.int64(i) for i in rows]):
        assert train.key(state, (Subset(dataset(), same), 0)) == key  # by content
    assert train.key(state, (Subset(ds, [1, 4, 7, 8]), 0)) != key  # other rows
    assert train.key(state, (Subset(dataset(0.5), rows), 0)) != key  # other data
    assert train.key(state, (Subset(Subset(ds, range(10)), [1, 4, 7, 9]), 0)) != key
    assert train.key(state, (Subset(ds, range(3)), 0)) == train.key(
        state, (Subset(ds, [0, 1, 2]), 0)
    )


def test_remembered_clients_given_subsets_are_recalled_each_as_its_own(tmp_path):
    ds = dataset()
    parts = fl.iid(ds, clients=3, seed=0)
    train = st.remember(client, keeper=DiskKeeper(tmp_path))
    state = st.state(Graph.somatize(Linear()))
    tasks = [(Subset(ds, p), c) for c, p in enumerate(parts)]
    first = fl.map_clients(None, train, tasks, shared=state)
    again = fl.map_clients(None, train, tasks, shared=state)
    plain = fl.map_clients(None, client, tasks, shared=state)
    assert [r.recalled for r in first] == [False] * 3 and [r.recalled for r in again] == [True] * 3
    for a, b, p in zip(again, first, plain):  # each client its own run, not client 0's
        assert all(
            torch.equal(a.state[k], b.state[k]) and torch.equal(a.state[k], p.state[k])
            for k in a.state
        )
    assert not torch.equal(again[0].state["linear.lin.weight"], again[1].state["linear.lin.weight"])


class Squares(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([float(i * i)]), i % 2


def test_a_subset_of_a_dataset_without_a_content_key_names_the_dataset(tmp_path):
    train = st.remember(client, keeper=DiskKeeper(tmp_path))
    state = st.state(Graph.somatize(Linear()))
    with pytest.raises(
        ValueConversionError, match=r"of client\[0\]\.dataset is an object of type .*Squares"
    ):
        train.key(state, (Subset(Squares(), [1, 2]), 0))
    with pytest.raises(ValueConversionError) as e:
        train.key(state, (Squares(), 0))
    # excluding a client's data would give every client one key: the message says when not to
    assert "if it does not change the result" in str(e.value)
    assert "every client recalls the first's run" in str(e.value)
