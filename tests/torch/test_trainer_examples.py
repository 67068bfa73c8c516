"""``TrainResult.num_examples`` — the weight ``fedavg`` gives a client — of a DataLoader, and
of data without a length: one epoch's examples, however many epochs the client trains."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset, WeightedRandomSampler

import somatize.torch as st
from somatize import Graph
from tests.torch.test_checkpoint_resume import Crash, CrashAt
from tests.torch.trainer_helpers import Linear


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


class Stream:
    """Batches read again each epoch, without ``__len__`` (a streaming loader)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def stream_fit(epochs, tmp_path=None, resume=None, watchers=(), max_steps=None):
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(10, 4, generator=gen), torch.randint(0, 3, (10,), generator=gen))
               for _ in range(4)]  # fmt: skip
    torch.manual_seed(0)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        max_steps=max_steps,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=3) if tmp_path else None,
        watchers=list(watchers),
        options=st.Options(progress=False),
    )
    return trainer.fit(Graph.somatize(Linear(4, 3)), Stream(batches), resume=resume)


def test_num_examples_of_unsized_data_is_one_epoch_so_fedavg_weighs_by_size_not_local_work():
    # the examples seen over every epoch were reported: two 40-example clients training
    # E = 1 and E = 3 epochs (FedProx's heterogeneous local work) weighed 0.25 and 0.75
    one, three = stream_fit(1), stream_fit(3)
    assert (one.num_examples, three.num_examples) == (40, 40) and three.epochs == 3
    assert st.fedavg([one, three]).weights == (0.5, 0.5)
    assert stream_fit(3, max_steps=2).num_examples == 20  # stopped within its first epoch


def test_num_examples_of_unsized_data_survives_a_resume_after_the_first_epoch(tmp_path):
    with pytest.raises(Crash):
        stream_fit(3, tmp_path, watchers=[CrashAt(7)])  # checkpointed at step 6, epoch 1
    resumed = stream_fit(3, tmp_path, resume="last")
    assert resumed.steps == 12 and resumed.num_examples == 40
