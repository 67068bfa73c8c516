"""Checkpoint save and load against bare ``torch.save``/``torch.load`` of the same state.

Both sides write 30 MiB to this disk and fsync it. Bare: ``torch.save`` to
``open(path, "wb")`` (which truncates the file the last save wrote, freeing its blocks;
torch's per-record CRC32 on), then fsync. somatize, as a fit saves (``ckptdir.writer``
held): the file rotation dropped two saves ago (keep=2) is written over in place
(``ckptspare``: no block freed nor allocated), hashed as it is written (blake3 trailer;
torch's CRC32 off), the disk's writeback started after each large tensor (Linux
``sync_file_range``), fsynced and renamed into place; then ``last`` is renamed over and
the directory fsynced once. The second row is ``Checkpointing.save`` outside a fit,
where rotation deletes the dropped file as bare's truncate does (a new file each save).
Loading: ``load_checkpoint`` (checksum verified, then a memory-mapped ``weights_only``
load and the payload check) against ``torch.load(weights_only=True)``. Each trial times
every side in turn (``number`` operations each); the ratio is taken per trial, its
median is the figure, and the worst trial is reported beside it, in wall time and in
CPU time (``time.process_time``).

On this disk (ext4 mounted ``discard``) freeing 30 MiB waits 5-15 ms for the device:
bare pays it in each save's truncate, a save outside a fit in its rotation's unlink, a
fit once, when it ends (its spare deleted, outside the timing). So that the journal
work one side leaves (an unlink, a truncate) is not committed inside the other side's
timed fsync, the journal is settled, untimed, after every batch of any side
(``settle``: an fsync of every directory, the same call for all).
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

    from somatize.torch import ckptdir

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
    fit = st.Checkpointing(os.path.join(root, "fit"), keep=2)
    plain = st.Checkpointing(os.path.join(root, "plain"), keep=2)
    bare = os.path.join(root, "bare.pt")
    counter = iter(range(1, 1 << 30))

    def save_bare() -> None:
        with open(bare, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())

    def settle() -> None:
        for d in (root, fit.path, plain.path):
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    # a file of its own to load (saves rotate the others away), its path resolved once
    newest = st.Checkpointing(os.path.join(root, "load")).save(payload, 1)
    fit.path.mkdir()
    plain.path.mkdir()

    # (case, somatize, bare, baseline's name, target, what each side does)
    cases: list[tuple[str, Callable[[], Any], Callable[[], Any], str, str, str]] = [
        (
            "save {mib} MiB (model + Adam state)",
            lambda: fit.save(payload, next(counter)),
            save_bare,
            "bare torch.save",
            "≤ 1.1×",
            "both fsync; somatize, as in a fit, writes over the file rotation dropped (temp "
            "name, blake3 trailer, rename, last, one directory fsync), bare truncates its "
            "file (its blocks freed) and rewrites it",
        ),
        (
            "save {mib} MiB outside a fit (rotation deletes the dropped file)",
            lambda: plain.save(payload, next(counter)),
            save_bare,
            "bare torch.save",
            "",
            "both fsync and free 30 MiB a save: somatize unlinks the dropped file, bare "
            "truncates its own",
        ),
        (
            "load {mib} MiB (model + Adam state)",
            lambda: st.load_checkpoint(newest),
            lambda: torch.load(bare, weights_only=True),
            "bare torch.load",
            "≤ 1.1×",
            "somatize verifies the checksum, maps the file and checks the payload",
        ),
    ]
    number, trials = (2, 3) if quick else (5, 9)
    samples: dict[str, list[tuple[float, float, float, float]]] = {c[0]: [] for c in cases}
    with ckptdir.writer(fit.path):  # as a fit holds it: its saves write over dropped files
        for _, ours, base, *_ in cases:  # warm-up: the third save drops the first (keep=2)
            ours(), ours(), ours(), base()
        settle()
        for _ in range(trials):
            for op, ours, base, *_ in cases:
                a = _timed(ours, number)
                settle()
                b = _timed(base, number)
                settle()
                samples[op].append((a[0], b[0], a[1], b[1]))
    rows = []
    for op, _, _, baseline, target, sides in cases:
        got = samples[op]
        wall = [a / b for a, b, _, _ in got]
        cpu = [c / d for _, _, c, d in got]
        ours_ms = [a * 1e3 for a, _, _, _ in got]
        ratio = statistics.median(wall)
        rows.append(
            Row(
                "checkpoint",
                op.format(mib=f"{mib:.0f}"),
                statistics.median(ours_ms),
                "ms",
                baseline=baseline,
                baseline_value=statistics.median(b for _, b, _, _ in got) * 1e3,
                ratio=ratio,
                target=target,
                met=ratio <= 1.1 if target else None,
                spread=f"{min(ours_ms):.2f} – {max(ours_ms):.2f} ms",
                cpu_ratio=statistics.median(cpu),
                note=f"{sides}; worst trial {max(wall):.2f}×, in CPU time {max(cpu):.2f}×",
            )
        )
    shutil.rmtree(root, ignore_errors=True)  # (run alone, outside run.py's own TMPDIR)
    return rows
