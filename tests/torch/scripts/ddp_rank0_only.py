"""``evaluate()`` called on rank 0 alone, launched by ``tests/torch/test_rank_lengths.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_rank0_only.py OUT_DIR

(found by a torchrun persona audit): after a ``fit`` on every rank, ``if rank == 0:
trainer.evaluate(...)`` failed on rank 0 with gloo's "Connection closed by peer ... typically
caused by a remote worker crashing" once rank 1 had exited — no rank had crashed; now the
error carries a note saying that ``evaluate()`` is collective under DDP. Rank 0 writes the
error it got to OUT_DIR/rank0.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st

torch.set_num_threads(1)


def main() -> None:
    out = Path(sys.argv[1])
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))] * 4
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    net = nn.Linear(4, 3)
    trainer.fit(net, batches)  # every rank: the Trainer's group, kept for later calls
    if os.environ["RANK"] != "0":
        return  # rank 1 skips the evaluation and exits
    try:
        trainer.evaluate(net, batches)
        said = ""
    except Exception as e:
        said = "\n".join([str(e), *getattr(e, "__notes__", [])])
    torch.save({"said": said}, out / "rank0.pt")


if __name__ == "__main__":
    main()
