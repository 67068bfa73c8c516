"""Data-parallel fits whose ranks hold batches of different sizes in a step (a last,
smaller batch), launched by ``tests/torch/test_ddp_uneven.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_uneven.py OUT_DIR

Each rank writes OUT_DIR/uneven-rank<R>.pt: for each way of stepping (one batch a step,
micro-batches, accumulated batches), the losses and final weights it ended with.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

import somatize.torch as st

sys.path.insert(0, str(Path(__file__).parent))
from ddp_train import graph

SIZES = [4, 4, 4, 4, 4, 2, 4, 1]  # under 2 ranks a step pairs 4 with 2, and 4 with 1
WAYS = {"batch": {}, "micro": {"micro_batches": 2}, "accumulate": {"accumulate": 2}}


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [
        (torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)) for n in SIZES
    ]


def trainer(micro_batches: int = 1, accumulate: int = 1) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.5),
        epochs=2,
        micro_batches=micro_batches,
        options=st.Options(progress=False, shuffle=False, accumulate=accumulate),
    )


def main() -> None:
    torch.set_num_threads(1)
    out = {}
    for name, kw in WAYS.items():
        result = trainer(**kw).fit(graph(), data())
        out[name] = {"losses": result.losses, "state": dict(result.state)}
    torch.save(out, Path(sys.argv[1]) / f"uneven-rank{os.environ['RANK']}.pt")


if __name__ == "__main__":
    main()
