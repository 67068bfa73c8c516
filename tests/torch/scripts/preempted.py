"""A run preempted by SIGTERM: the subject of ``tests/torch/test_stopping.py``'s process test.

    python tests/torch/scripts/preempted.py CKPT_DIR STEP [--watch]

Trains with ``Options(stop_on="SIGTERM")`` and ``Checkpointing(CKPT_DIR, every_steps=1000)``
(so the only periodic checkpoints are the epochs' ends). At training step STEP the model
prints ``step STEP`` and waits for a line on standard input: the test sends SIGTERM, then
the line, so the signal comes during that step, every time. ``--watch`` adds a watcher
(the general loop; without it, the fast path). Exits as ``fit`` makes it: 143 after a
SIGTERM. The test imports it for the same model, data and Trainer.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.watchers import Recorder

BATCHES, EPOCHS = 6, 3


class Body(Node):
    def __init__(self, pause_at: int | None = None) -> None:
        self.lin = nn.Linear(5, 3)
        self.drop = nn.Dropout(0.3)  # uses the torch RNG: the resume must restore it exactly
        self.pause_at = pause_at

    def forward(self, x, ctx):
        if ctx.training and ctx.step == self.pause_at:
            os.write(1, f"step {ctx.step}\n".encode())
            while os.read(0, 1) not in (b"\n", b""):  # (the test's line: the signal was sent)
                pass
        return Done(Opaque(self.lin(self.drop(x))))


def graph(pause_at: int | None = None) -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Body(pause_at))


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    return [
        (torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(BATCHES)
    ]


def trainer(ckpt_dir, watch: bool, stop_on="SIGTERM") -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7),
        epochs=EPOCHS,
        checkpoint=st.Checkpointing(ckpt_dir, every_steps=1000) if ckpt_dir else None,
        watchers=[Recorder()] if watch else [],
        seed=3,
        options=st.Options(progress=False, stop_on=stop_on),
    )


def main() -> None:
    torch.set_num_threads(1)
    ckpt_dir, step = sys.argv[1], int(sys.argv[2])
    trainer(ckpt_dir, "--watch" in sys.argv).fit(graph(step), data())
    os.write(1, b"done\n")  # (not reached: the signal stops the run)


if __name__ == "__main__":
    main()
