"""A data-parallel training run, launched by the DDP test as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_train.py OUT_DIR [--crash-at STEP] [--resume]

Every rank writes what it ends with to OUT_DIR/rank<R>.pt. The ranks share one
checkpoint directory; each rank that calls ``Checkpointing.save_chain`` leaves a file
``saved-rank<R>``, and each gives the Trainer its own run log and TensorBoard
directory, so the test can see that only rank 0 writes. ``--crash-at`` makes rank
0 fail at the end of that step; ``--resume`` continues from the last checkpoint.
``--accumulate``, ``--clip-value V`` and ``--log-grad-norm`` set those options.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, JsonLines, Node, Opaque
from somatize.watchers import StepEnd


class Linear(Node):
    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Tanh(Node):
    """Reports the share of its positive outputs: a node metric, each rank's own batches'."""

    def forward(self, x, ctx):
        h = torch.tanh(x)
        return Done(Opaque(h), metrics={"pos": (h > 0).float().mean()})


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Linear(4, 8) >> Tanh() >> Linear(8, 3))


def data() -> tuple[list, list]:
    gen = torch.Generator().manual_seed(1)

    def batch(n):
        return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)

    return [batch(4) for _ in range(8)], [batch(5) for _ in range(3)]  # 3 val batches: uneven


class Augmented(torch.utils.data.Dataset):
    """32 examples with random noise added on reading (rank 1 draws twice as many numbers,
    so the ranks' RNG streams differ, as per-rank augmentation makes them); records the
    indices it reads."""

    def __init__(self, rank: int) -> None:
        gen = torch.Generator().manual_seed(2)
        self.x, self.y = (
            torch.randn(32, 4, generator=gen),
            torch.randint(0, 3, (32,), generator=gen),
        )
        self.rank, self.seen = rank, []

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i):
        self.seen.append(i)
        for _ in range(self.rank + 1):
            noise = torch.randn(4) * 0.01
        return self.x[i] + noise, self.y[i]


class CrashAt:
    def __init__(self, step: int) -> None:
        self.step = step

    def on_event(self, event) -> None:
        if isinstance(event, StepEnd) and event.step == self.step:
            raise RuntimeError(f"crashing at step {self.step}, as asked")


def trainer(
    out: Path | None,
    rank: int,
    micro_batches: int,
    crash_at: int = 0,
    accumulate: int = 1,
    clip_value: float | None = None,
    log_grad_norm: bool = False,
    extra: tuple = (),
) -> st.Trainer:
    where = (lambda name: out / f"{name}-rank{rank}") if out is not None else None
    watchers = [
        *(
            [JsonLines(where("log").with_suffix(".jsonl")), st.TensorBoard(where("tb"))]
            if where
            else []
        ),
        *extra,
    ]
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.2, momentum=0.5),
        epochs=2,
        micro_batches=micro_batches,
        metrics={"acc": st.accuracy},
        checkpoint=st.Checkpointing(out / "ckpt", every_steps=3) if out is not None else None,
        watchers=[*watchers, CrashAt(crash_at)] if crash_at else watchers,
        options=st.Options(
            progress=False,
            shuffle=False,
            accumulate=accumulate,
            clip_grad_value=clip_value,
            log_grad_norm=log_grad_norm,
        ),
    )


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    save = st.Checkpointing.save_chain  # what the Trainer saves with

    def recorded(self, payload, step, **kw):
        (out / f"saved-rank{rank}").touch()
        return save(self, payload, step, **kw)

    st.Checkpointing.save_chain = recorded
    crash_at = int(sys.argv[sys.argv.index("--crash-at") + 1]) if "--crash-at" in sys.argv else 0
    train, val = data()
    dataset = None
    if "--loader" in sys.argv:  # a DataLoader: the Trainer gives it a DistributedSampler
        dataset = Augmented(rank)
        train = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    accumulate = 2 if "--accumulate" in sys.argv else 1
    clip = (
        float(sys.argv[sys.argv.index("--clip-value") + 1]) if "--clip-value" in sys.argv else None
    )
    result = trainer(
        out,
        rank,
        micro_batches=1 if accumulate > 1 else 2,
        crash_at=crash_at,
        accumulate=accumulate,
        clip_value=clip,
        log_grad_norm="--log-grad-norm" in sys.argv,
    ).fit(graph(), train, val=val, resume="last" if "--resume" in sys.argv else None)
    torch.save(
        {
            "state": dict(result.state),
            "losses": result.losses,
            "metrics": result.metrics,
            "epoch_metrics": result.epoch_metrics,
            "num_examples": result.num_examples,
            "val_examples": dict(result.val_examples),
            "steps": result.steps,
            "checkpoint": result.checkpoint,
            "world": int(os.environ["WORLD_SIZE"]),
            "seen": dataset.seen if dataset is not None else [],
        },
        out / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main()
