"""A sweep of fits in one torchrun job, then an evaluation, launched by the DDP test as

    torchrun --nproc_per_node=2 ... tests/torch/scripts/ddp_sweep.py OUT_DIR

Each rank writes, to OUT_DIR/sweep-rank<R>.pt, every fit's losses and final weights and
the evaluation after them, and whether the process group the first fit made was still
the same one at the end.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F

import somatize.torch as st

sys.path.insert(0, str(Path(__file__).parent))
from ddp_train import data, graph

LRS = (0.1, 0.05, 0.01)  # the sweep


def sweep_trainer(lr: float) -> st.Trainer:
    """One fit of the sweep (the test trains the same in one process)."""
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
        epochs=1,
        seed=0,
        options=st.Options(progress=False, shuffle=False),
    )


def main() -> None:
    torch.set_num_threads(1)
    out, rank = Path(sys.argv[1]), int(os.environ["RANK"])
    train, val = data()
    fits, groups = [], []
    for lr in LRS:
        trainer = sweep_trainer(lr)
        result = trainer.fit(graph(), train, val=val)
        groups.append(dist.group.WORLD if dist.is_initialized() else None)
        fits.append({"losses": result.losses, "state": dict(result.state)})
    evaluated = trainer.evaluate(graph(), val)
    torch.save(
        {
            "fits": fits,
            "one_group": groups[0] is not None and all(g is groups[0] for g in groups),
            "evaluated": evaluated,
        },
        out / f"sweep-rank{rank}.pt",
    )


if __name__ == "__main__":
    main()
