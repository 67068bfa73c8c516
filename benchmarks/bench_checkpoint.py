"""Checkpoint save and load against bare ``torch.save``/``torch.load`` of the same state.

Both sides fsync: the bare baseline writes with ``torch.save`` to an open file and
fsyncs it; somatize writes a temp file, fsyncs, renames, fsyncs the directory and
updates ``last``. Loading: ``load_checkpoint`` against ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from common import Row, interleave, per_call

import somatize.torch as st


def run(quick: bool) -> list[Row]:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.Linear(1024, 512)
    )
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1024)).sum().backward()
    opt.step()
    payload: dict[str, Any] = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": 1,
    }
    mib = sum(p.numel() for p in model.parameters()) * 4 * 3 / 2**20
    root = tempfile.mkdtemp(prefix="somatize-bench-")
    ckpt = st.Checkpointing(os.path.join(root, "ckpt"), keep=2)
    bare = os.path.join(root, "bare.pt")
    counter = iter(range(1, 1 << 30))

    def save_bare() -> None:
        with open(bare, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())

    def save_somatize() -> None:
        ckpt.save(payload, next(counter))

    save_bare()
    save_somatize()
    number = 2 if quick else 5
    t = interleave(
        {
            "save somatize": per_call(save_somatize, number),
            "save bare": per_call(save_bare, number),
            "load somatize": per_call(lambda: st.load_checkpoint(ckpt.last()), number),
            "load bare": per_call(lambda: torch.load(bare, weights_only=True), number),
        },
        trials=3 if quick else 7,
    )
    rows = []
    for op in ("save", "load"):
        ours, base = t[f"{op} somatize"].median, t[f"{op} bare"].median
        rows.append(
            Row(
                "checkpoint",
                f"{op} {mib:.0f} MiB (model + Adam state)",
                ours * 1e3,
                "ms",
                baseline=f"bare torch.{op}",
                baseline_value=base * 1e3,
                ratio=ours / base,
                target="≤ 1.1×",
                met=ours / base <= 1.1,
            )
        )
    return rows
