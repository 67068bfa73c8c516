"""``TrainResult.num_examples`` — the weight ``fedavg`` gives a client — of a DataLoader."""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset, WeightedRandomSampler

import somatize.torch as st
from somatize import Graph
from tests.torch.test_trainer import Linear


def test_num_examples_counts_what_a_dataloaders_sampler_draws_not_the_whole_dataset():
    # fedavg weighs clients by num_examples: a client given its rows by a sampler over a
    # shared dataset must count its rows, not the dataset's
    gen = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(64, 4, generator=gen), torch.randint(0, 3, (64,), generator=gen))

    def fit(loader):
        torch.manual_seed(0)
        g = Graph.somatize(Linear(4, 3))
        trainer = st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            options=st.Options(progress=False),
        )
        return trainer.fit(g, loader).num_examples

    assert fit(DataLoader(ds, batch_size=8, sampler=SubsetRandomSampler(range(20)))) == 20
    weighted = WeightedRandomSampler([1.0] * 64, num_samples=30, generator=gen)
    assert fit(DataLoader(ds, batch_size=8, sampler=weighted)) == 30
    assert fit(DataLoader(ds, batch_size=8, sampler=weighted, drop_last=True)) == 24
    assert fit(DataLoader(ds, batch_size=8, shuffle=True)) == 64
