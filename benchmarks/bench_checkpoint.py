"""Checkpoint save and load against bare ``torch.save``/``torch.load`` of the same state.

Both sides fsync: the bare baseline writes with ``torch.save`` to an open file and
fsyncs it; somatize writes a temp file while hashing it (blake3 trailer), starting the
disk's writeback after each large tensor (Linux ``sync_file_range``: bare ``torch.save``
leaves all 30 MiB to its fsync), fsyncs, renames, fsyncs the directory and updates
``last``. Loading: ``load_checkpoint``
(checksum verified, then a memory-mapped ``weights_only`` load and the payload check)
against ``torch.load(weights_only=True)``. Each trial times both sides in turn; the
ratio is taken per trial, its median is the figure, and the worst trial is reported
beside it, in wall time and in CPU time (``time.process_time``). A save costs one data
fsync and one directory fsync (bare: one data fsync); ``last`` is renamed into place
between the two renames and the directory fsync.

Both sides free the previous 30 MiB each save (bare: ``open(..., "wb")`` truncates it;
somatize: rotation unlinks the oldest checkpoint after the new one is durable). The
truncate is committed by bare's own fsync; the unlink by the next save's. So that a
batch of saves does not leave its last unlink (and the discard of its blocks: this disk
is mounted ``discard``) to be committed inside the other side's timed fsync, the journal
is settled, untimed, after every batch of either side (``settle``: an fsync of both
directories, the same call for both).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from common import Row

import somatize.torch as st


def _timed(fn: Callable[[], Any], number: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(number):
        fn()
    return (time.perf_counter() - wall) / number, (time.process_time() - cpu) / number


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
    s = st.checkpoint.RunState()
    payload: dict[str, Any] = st.checkpoint.capture(s, model, opt, None, None, 0)
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

    def settle() -> None:
        for d in (root, ckpt.path):
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    # a file of its own to load (saves rotate the others away), its path resolved once
    newest = st.Checkpointing(os.path.join(root, "load")).save(payload, 1)

    pairs = {
        "save": (save_somatize, save_bare, "bare torch.save"),
        "load": (
            lambda: st.load_checkpoint(newest),
            lambda: torch.load(bare, weights_only=True),
            "bare torch.load",
        ),
    }
    number, trials = (2, 3) if quick else (5, 9)
    for ours, base, _ in pairs.values():  # warm-up
        ours(), base()
    samples: dict[str, list[tuple[float, float, float, float]]] = {op: [] for op in pairs}
    for _ in range(trials):
        for op, (ours, base, _) in pairs.items():
            a = _timed(ours, number)
            settle()
            b = _timed(base, number)
            settle()
            samples[op].append((a[0], b[0], a[1], b[1]))
    rows = []
    for op, (_, _, baseline) in pairs.items():
        got = samples[op]
        wall = [a / b for a, b, _, _ in got]
        cpu = [c / d for _, _, c, d in got]
        ours_ms = statistics.median(a for a, _, _, _ in got) * 1e3
        base_ms = statistics.median(b for _, b, _, _ in got) * 1e3
        ratio = statistics.median(wall)
        rows.append(
            Row(
                "checkpoint",
                f"{op} {mib:.0f} MiB (model + Adam state)",
                ours_ms,
                "ms",
                baseline=baseline,
                baseline_value=base_ms,
                ratio=ratio,
                target="≤ 1.1×",
                met=ratio <= 1.1,
                note=(
                    f"worst trial {max(wall):.2f}×; CPU time {statistics.median(cpu):.2f}× "
                    f"(worst {max(cpu):.2f}×)"
                ),
            )
        )
    shutil.rmtree(root, ignore_errors=True)  # (run alone, outside run.py's own TMPDIR)
    return rows
