"""Batches as users' datasets make them (somatize/torch/batches.py): namedtuples, dataclass
instances and mappings other than dict are walked field by field — moved, chunked into
micro-batches, counted — and rebuilt as their own types; a model that takes them trains
as a plain loop trains it."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize.errors import SettingError
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


class Tempered(nn.Module):
    """Takes a dict batch whose first tensor is a scalar (a temperature), not a row each."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self.lin(b["x"]) / b["t"], b["y"])


def test_a_scalar_beside_the_rows_goes_whole_into_every_micro_batch() -> None:
    # it raised torch's "chunk expects at least a 1-dimensional tensor", and was counted
    # as the batch's size (1 example where there were 6)
    data = [{"t": torch.tensor(2.0), "x": x, "y": y} for x, y, _ in rows()]
    assert num_examples(data[0]) == 6
    plain = Tempered()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for b in data:
        opt.zero_grad()
        plain(b).backward()
        opt.step()
    net = Tempered()
    trainer = st.Trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), micro_batches=2,
                         options=quiet(shuffle=False))  # fmt: skip
    assert trainer.fit(net, data).num_examples == 4 * 6
    assert all(torch.allclose(a, b) for a, b in zip(net.parameters(), plain.parameters()))


class Masked(nn.Module):
    """(x, mask): a causal mask shared by every row, (seq, seq), beside x (batch, seq, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, mask = inputs
        return self.lin((mask @ x).mean(1))


def test_micro_batches_refuse_a_tensor_without_the_batch_rows() -> None:
    # each chunk got a few of the mask's rows, and trained on that without a word
    x, mask, y = torch.randn(8, 5, 4), torch.tril(torch.ones(5, 5)), torch.randint(0, 3, (8,))
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                         micro_batches=2, options=quiet())  # fmt: skip
    said = r"micro_batches=2 .* inputs\[0\] of shape \(8, 5, 4\) and inputs\[1\] of shape \(5, 5\)"
    with pytest.raises(SettingError, match=said + r" disagree .*Options\(accumulate=k\)"):
        trainer.fit(Masked(), [((x, mask), y)])
    with pytest.raises(SettingError, match=r"inputs\['ids'\] of shape \(6, 2\) and inputs"):
        chunk({"ids": torch.zeros(6, 2), "image": torch.zeros(4, 3)}, 2)
    expanded = (x, mask.expand(8, 5, 5))  # the fix it names: every row its own mask
    assert [p[1].shape for p in chunk(expanded, 2)] == [(4, 5, 5), (4, 5, 5)]
