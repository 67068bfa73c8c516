"""docs/trainer.md's batch-order seeds: a plain loop reading batches by them trains the
Trainer's run bitwise, for a sequence of batches and for a shuffling DataLoader."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st

torch.set_num_threads(1)

SEED, EPOCHS = 7, 3


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def rows():
    g = torch.Generator().manual_seed(1)
    return torch.randn(40, 5, generator=g), torch.randint(0, 3, (40,), generator=g)


def plain(net: nn.Module, epoch_batches) -> tuple[list[float], nn.Module]:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for e in range(EPOCHS):
        for x, y in epoch_batches(e):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, net


def trained(net: nn.Module, train) -> st.TrainResult:
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=EPOCHS,
        seed=SEED,
        options=st.Options(progress=False),
    )
    return trainer.fit(net, train)


def test_a_sequence_is_read_in_the_documented_order():
    x, y = rows()
    train = list(zip(x.split(8), y.split(8)))
    net = model()
    ref = copy.deepcopy(net)

    def order(e):
        gen = torch.Generator().manual_seed(SEED * 1_000_003 + e)
        return [train[i] for i in torch.randperm(len(train), generator=gen)]

    losses, ref = plain(ref, order)
    result = trained(net, train)
    assert result.losses == losses
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))


def test_a_dataloader_is_read_in_the_documented_order():
    x, y = rows()
    net = model()
    ref = copy.deepcopy(net)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    plain_loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)

    def order(e):
        plain_loader.sampler.generator = torch.Generator().manual_seed(SEED * 1_000_003 + e)
        plain_loader.generator = torch.Generator().manual_seed(SEED * 1_000_003 + e + 500_009)
        return plain_loader

    losses, ref = plain(ref, order)
    result = trained(net, loader)
    assert result.losses == losses
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))
