"""``TrainResult.num_examples`` — the weight ``fedavg`` gives a client — of a DataLoader, and
of data without a length: one epoch's examples, however many epochs the client trains."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset, WeightedRandomSampler

import somatize.torch as st
from somatize import Graph, Recorder
from somatize.errors import SettingError
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


def _trainer(**kwargs) -> st.Trainer:
    options = kwargs.pop("options", {})
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=kwargs.pop("optimizer", lambda ps: torch.optim.SGD(ps, lr=0.1)),
        options=st.Options(progress=False, **options),
        **kwargs,
    )


def test_a_limited_epoch_counts_what_an_oversampling_sampler_draws():
    """Found by an outside audit: capped at the dataset's length, a limited epoch of a
    sampler drawing 200 of 45 rows counted 45 while it trained on 80."""
    gen = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(45, 4, generator=gen), torch.randint(0, 3, (45,), generator=gen))
    sampler = WeightedRandomSampler(torch.ones(45), num_samples=200, replacement=True)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    model = torch.nn.Linear(4, 3)
    assert _trainer(options={"limit_train_batches": 10}).fit(model, loader).num_examples == 80
    assert _trainer().fit(model, loader).num_examples == 200


def test_the_examples_of_a_list_of_batches_are_counted_as_the_steps_count_them():
    """Found by an outside audit: with split=, a list of dict batches counted one example
    a batch (its 0-d first value), not the rows of the inputs split gives the model."""
    gen = torch.Generator().manual_seed(0)
    batches = [
        {"tokens": torch.tensor(10 * n), "input": torch.randn(n, 4, generator=gen),
         "labels": torch.randint(0, 3, (n,), generator=gen)}
        for n in (5, 7, 3, 8)
    ]  # fmt: skip
    split = lambda b: (b["input"], b["labels"])  # noqa: E731
    model = torch.nn.Linear(4, 3)
    assert _trainer(split=split).fit(model, batches).num_examples == 23
    limited = _trainer(split=split, options={"limit_train_batches": 2, "shuffle": False})
    assert limited.fit(model, batches).num_examples == 12


def test_an_optimizer_over_all_the_models_parameters_frozen_ones_too_trains_the_rest():
    """Found by an outside audit: ``AdamW(model.parameters())`` with a frozen layer was
    refused as updating tensors not of the model; torch skips them (their grad is None)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model[0].requires_grad_(False)
    frozen, head = model[0].weight.clone(), model[2].weight.clone()
    optimizer = lambda ps: torch.optim.AdamW(model.parameters(), weight_decay=0.1)  # noqa: E731
    batches = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(3)]
    assert _trainer(optimizer=optimizer).fit(model, batches).steps == 3
    assert torch.equal(model[0].weight, frozen) and not torch.equal(model[2].weight, head)
    other = torch.nn.Linear(4, 3)
    with pytest.raises(SettingError, match="not trainable parameters of the model"):
        _trainer(optimizer=lambda ps: torch.optim.SGD(other.parameters(), lr=0.1)).fit(
            model, batches
        )


def test_a_plain_modules_own_metrics_attribute_is_its_own():
    """Found by an outside audit: a module keeping its torchmetrics in ``self.metrics`` was
    read as the graph's node metrics, and evaluate() and fit(val=...) failed."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(4, 3)
            self.metrics = ["acc", "f1"]  # (a torchmetrics collection, as often)

        def forward(self, x):
            return self.body(x)

    batches = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(2)]
    assert set(_trainer().evaluate(Net(), batches)) == {"loss"}
    result = _trainer(watchers=[Recorder()]).fit(Net(), batches, val=batches)
    assert [sorted(m) for m in result.metrics] == [["epoch", "step", "val_loss"]]
