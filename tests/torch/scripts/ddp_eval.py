"""What evaluation under DDP gets right, launched by ``tests/torch/test_ddp_eval.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_eval.py OUT_DIR

(each found wrong by an outside audit):

* ``Options(ema=)`` over a BatchNorm graph: the fit's evaluations are of rank 0's
  average, its buffers too (rank 1 evaluated its own running statistics);
* a validation loader whose sampler draws from the global RNG (``SubsetRandomSampler``),
  read after the ranks' RNGs diverged: every row once (rows were read twice, others never);
* a NaN loss on rank 1 only: rank 0's error says another rank's loss was not finite
  (it called its own finite loss the bad one).

Every rank writes what it got to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import NonFiniteError


class Body(Node):
    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


class Rows:
    """How many rows an evaluation read, and how many distinct ones (merged over ranks)."""

    def reset(self) -> None:
        self.seen: list[float] = []

    def update(self, output, target) -> None:
        self.seen += target.tolist()

    def compute(self) -> float:
        return float(len(set(self.seen)) * 1000 + len(self.seen))

    def merge(self, other: Rows) -> None:
        self.seen += other.seen


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Body())


def trainer(**kwargs) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=st.Options(progress=False, shuffle=False, **kwargs.pop("options", {})),
        **kwargs,
    )


def batches(rank_shift: bool = True) -> list:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(8):  # every other batch shifted: the ranks' running statistics differ
        x = torch.randn(4, 4, generator=gen) + (3.0 if i % 2 and rank_shift else 0.0)
        out.append((x, torch.randint(0, 3, (4,), generator=gen)))
    return out


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    val = batches(rank_shift=False)[:3]
    got: dict = {}

    g = graph()
    fitted = trainer(options={"ema": 0.5}).fit(g, batches(), val=val)
    got["ema_val"] = fitted.metrics[-1]["val_loss"]
    got["ema_evaluated"] = trainer().evaluate(g, val)["loss"]

    torch.rand(5 + 7 * rank)  # the ranks' global RNGs apart, as augmentation leaves them
    rows = TensorDataset(torch.randn(12, 4), torch.arange(12.0))
    loader = DataLoader(rows, batch_size=2, sampler=SubsetRandomSampler(range(12)))
    counter = st.Trainer(
        loss=lambda out, y: out.sum() * 0, metrics={"rows": Rows()}
    )  # (the targets are row numbers: no loss of them)
    got["rows"] = counter.evaluate(nn.Linear(4, 3), loader)["rows"]

    poisoned = batches()
    poisoned[3] = (poisoned[3][0] * float("nan"), poisoned[3][1])  # rank 1's second batch
    try:
        trainer().fit(graph(), poisoned)
        got["nonfinite"] = ""
    except NonFiniteError as e:
        got["nonfinite"] = str(e)
    dist.destroy_process_group()
    torch.save(got, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
