"""``Options(max_time=...)`` under DDP, launched by the DDP test as

    torchrun --nproc_per_node=2 ... tests/torch/scripts/ddp_max_time.py OUT_DIR

Each rank's clock is a fake one its model moves on every training forward: rank 1's by
two seconds, rank 0's by one. With a budget of 5.5 seconds rank 1's is spent after step
3 and rank 0's would be after step 6: the ranks must stop together, at step 3 (a rank
going on alone would wait forever for the other's gradients), and evaluate together, once.
Every rank writes what it ends with to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

RANK = int(os.environ["RANK"])
NOW = [0.0]
time.monotonic = lambda: NOW[0]  # (this process's clock: the fake one)


class Tick(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 1)

    def forward(self, x, ctx):
        if ctx.training:
            NOW[0] += 1.0 + RANK
        return Done(Opaque(self.lin(x)))


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 4, generator=gen), torch.randn(4, 1, generator=gen)) for _ in range(20)]
    result = st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=st.Options(progress=False, shuffle=False, max_time=5.5),
    ).fit(Graph.somatize(Tick()), data, val=data[:4])  # (evaluates at the stop: both ranks)
    torch.save(
        {
            "state": dict(result.state),
            "steps": result.steps,
            "timed_out": result.timed_out,
            "metrics": result.metrics,
        },
        out / f"rank{RANK}.pt",
    )


if __name__ == "__main__":
    main()
