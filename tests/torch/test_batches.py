"""Batches as users' datasets make them (somatize/torch/batches.py): namedtuples, dataclass
instances and mappings other than dict are walked field by field — moved, chunked into
micro-batches, counted — and rebuilt as their own types; a model that takes them trains
as a plain loop trains it."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize.torch.batches import chunk, num_examples, to_device
from tests.torch.trainer_helpers import quiet

Weighted = collections.namedtuple("Weighted", "x y w")


@dataclasses.dataclass(frozen=True)
class Record:
    x: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor
    name: str = "batch"


class Mapped(collections.UserDict):  # a Mapping that is not a dict (BatchEncoding is one)
    pass


class Net(nn.Module):
    """Computes its own weighted loss from the whole batch (Trainer(loss=None))."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, b: Any) -> torch.Tensor:
        x, y, w = (b["x"], b["y"], b["w"]) if isinstance(b, Mapped) else (b.x, b.y, b.w)
        return (F.cross_entropy(self.lin(x), y, reduction="none") * w).mean()


def rows(n: int = 4, size: int = 6) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [
        (
            torch.randn(size, 4, generator=gen),
            torch.randint(0, 3, (size,), generator=gen),
            torch.rand(size, generator=gen),
        )
        for _ in range(n)
    ]


def test_containers_are_rebuilt_as_their_own_types() -> None:
    x, y, w = rows(1)[0]
    for batch in (Weighted(x, y, w), Record(x, y, w), Mapped(x=x, y=y, w=w)):
        moved = to_device(batch, torch.device("cpu"))
        assert type(moved) is type(batch)
        parts = chunk(batch, 4)  # 6 rows: 2, 2, 2
        assert [type(p) for p in parts] == [type(batch)] * 3
        got = parts[1]["x"] if isinstance(batch, Mapped) else parts[1].x
        assert torch.equal(got, x[2:4])
    assert chunk(Record(x, y, w, name="kept"), 2)[0].name == "kept"  # non-tensors stay
    assert num_examples(Record(x, y, w)) == 6


def test_whole_batch_types_train_as_a_plain_loop() -> None:
    """loss=None: the model gets the namedtuple/dataclass/mapping whole, as a plain loop
    would give it (these raised TypeError in walking the batch before)."""
    data = rows()
    plain = Net()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for x, y, w in data:
        opt.zero_grad()
        plain(Weighted(x, y, w)).backward()
        opt.step()
    for make in (Weighted, Record, lambda x, y, w: Mapped(x=x, y=y, w=w)):
        for k in (1, 2):  # micro-batches chunk each field
            net = Net()
            st.Trainer(
                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                micro_batches=k,
                options=quiet(shuffle=False),
            ).fit(net, [make(*b) for b in data])
            close = torch.equal if k == 1 else torch.allclose
            assert all(close(a, b) for a, b in zip(net.parameters(), plain.parameters()))


def test_predict_takes_a_namedtuple_batch_whole() -> None:
    x, y, w = rows(1)[0]
    out = st.Trainer().predict(Net(), [Weighted(x, y, w)])
    assert torch.equal(out[0], Net()(Weighted(x, y, w)).detach())
