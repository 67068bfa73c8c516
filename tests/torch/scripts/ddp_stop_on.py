"""``Options(stop_on="SIGTERM")`` under DDP, launched by the DDP test as

    torchrun --nproc_per_node=2 ... tests/torch/scripts/ddp_stop_on.py OUT_DIR

Rank 1 alone is sent SIGTERM (by itself) during training step 5; rank 0 never is. Both
must stop at the end of step 5 (a rank going on alone would wait forever for the other's
gradients), rank 0 checkpoints into OUT_DIR/ckpt, and ``fit`` raises ``SystemExit(143)`` on
both. Each rank writes "<last step trained> <exit code>" to OUT_DIR/rank<R>.txt. (Once
rank 0 has exited, torchrun may SIGTERM rank 1 while its interpreter shuts down, with
``fit``'s handler gone: its process's status is not the test's to assert.)
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

RANK = int(os.environ["RANK"])
OUT = Path(sys.argv[1])
LAST = [0]  # the last training step this rank's model computed


class Lin(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 1)

    def forward(self, x, ctx):
        if ctx.training:
            LAST[0] = ctx.step
        if ctx.training and ctx.step == 5 and RANK == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return Done(Opaque(self.lin(x)))


def write(name: str, text: str) -> None:
    (OUT / f"{name}.tmp").write_text(text)
    os.replace(OUT / f"{name}.tmp", OUT / name)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 4, generator=gen), torch.randn(4, 1, generator=gen)) for _ in range(20)]
    trainer = st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        checkpoint=st.Checkpointing(OUT / "ckpt", every_steps=1000),
        options=st.Options(progress=False, shuffle=False, stop_on="SIGTERM"),
    )
    try:
        trainer.fit(Graph.somatize(Lin()), data)
    except SystemExit as e:
        write(f"rank{RANK}.txt", f"{LAST[0]} {e.code}")
        raise
    write(f"rank{RANK}.txt", f"{LAST[0]} 0")


if __name__ == "__main__":
    main()
