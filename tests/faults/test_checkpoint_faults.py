"""Checkpoints under fire: SIGKILL mid-save, flipped bits, cut files, a full or read-only disk."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import select
import signal
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import somatize.torch as st
from somatize.errors import CheckpointError
from somatize.torch import ckptdir, ckptspare
from somatize.torch.checkpoint import rng_state

from .conftest import TRIALS


def payload(step: int, numel: int = 50_000) -> dict:
    """A complete checkpoint payload whose every tensor says which step wrote it.

    Built with numpy: a forked child must not enter torch's intra-op thread pool (the
    parent's pool does not survive a fork).
    """
    w = torch.from_numpy(np.full(numel, float(step), dtype=np.float32))
    return {
        "model": {"w": w, "b": torch.from_numpy(np.array([step]))},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": None,
        "step": step,
        "epoch": 0,
        "position": 0,
        "examples_seen": step,
        "losses": [float(step)] * 3,
        "metrics": [],
        "best": None,
        "pruned": False,
        "pruner": None,
        "rng": rng_state(),
        "seed": 0,
    }


def assert_right(path: Path) -> int:
    """The checkpoint at ``path`` loads and holds exactly what its step wrote; its step."""
    got = st.load_checkpoint(path)
    step = int(path.name[5:14])
    assert got["step"] == step
    assert torch.equal(got["model"]["w"], torch.full_like(got["model"]["w"], float(step)))
    assert got["losses"] == [float(step)] * 3
    return step


def _save_forever(directory: str, start: int, ack: int, fit: bool) -> None:
    ckpt = st.Checkpointing(directory, keep=3)
    step = start
    # in a fit (its writer held) each save writes over the file rotation dropped
    with ckptdir.writer(ckpt.path) if fit else contextlib.nullcontext():
        while True:
            ckpt.save(payload(step), step)
            os.write(ack, f"{step}\n".encode())
            step += 1


def _acks(fd: int, timeout: float) -> list[int]:
    """The steps acknowledged so far (waits up to ``timeout`` for the first)."""
    out = b""
    ready, _, _ = select.select([fd], [], [], timeout)
    while ready:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
        ready, _, _ = select.select([fd], [], [], 0)
    return [int(x) for x in out.split()]


@pytest.mark.slow
@pytest.mark.parametrize("fit", [False, True], ids=["save", "in-a-fit"])
def test_sigkill_at_random_instants_of_checkpoint_saves_loses_nothing_acknowledged(
    tmp_path, rng, fit
):
    directory = tmp_path / "ckpt"
    ctx = multiprocessing.get_context("fork")  # torch is imported already: a fast child
    acked = 0
    for _trial in range(TRIALS):
        r, w = os.pipe()
        child = ctx.Process(target=_save_forever, args=(str(directory), acked + 1, w, fit))
        child.start()
        os.close(w)
        try:
            got = _acks(r, 60)
            assert got, "the saver acknowledged nothing"
            time.sleep(rng.uniform(0, 0.08))  # the fault: land anywhere in a later save
            os.kill(child.pid, signal.SIGKILL)
            child.join(30)
            got += _acks(r, 0)
        finally:
            os.close(r)
            if child.is_alive():
                child.kill()
                child.join()
        acked = max(got)
        # every file visible is whole and right; last names one at least as new as acked
        for f in sorted(directory.glob("step-*.ckpt")):
            assert_right(f)
        last = st.Checkpointing(directory).last()
        assert last is not None and assert_right(last) >= acked
        acked = assert_right(last)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_flipped_bits_and_cut_files_never_load_and_last_falls_back(tmp_path, rng, damage):
    ckpt = st.Checkpointing(tmp_path / "ckpt", keep=5)
    for step in range(1, 4):
        ckpt.save(payload(step, numel=2_000), step)
    newest = ckpt.file(3)
    good = newest.read_bytes()
    for _ in range(4 * TRIALS):
        bad = bytearray(good)
        if damage == "flip":
            for _ in range(rng.choice([1, 1, 2, 8])):
                bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        else:
            del bad[rng.randrange(len(bad)) :]
        if bad == good:
            continue
        newest.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError, match=r"step-000000003\.ckpt"):
            st.load_checkpoint(newest)
        with pytest.warns(UserWarning, match="falling back"):
            assert assert_right(ckpt.last()) == 2


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


def test_a_full_then_read_only_disk_is_a_checkpoint_error_and_damages_nothing(tmpfs, rng):
    ckpt = st.Checkpointing(tmpfs / "ckpt", keep=3)
    numel = rng.randrange(60_000, 75_000)  # 240-300 kB a file: the fourth does not fit in 1 MiB
    saved = 0
    with pytest.raises(
        CheckpointError, match=r"could not write checkpoint .*step-0000000\d\d"
    ) as e:
        for step in range(1, 20):
            ckpt.save(payload(step, numel), step)
            saved = step
    assert saved >= 2
    cause = e.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, repr(cause)
    assert "No space left" in str(e.value)
    files = sorted(ckpt.path.glob("step-*.ckpt"))
    assert files and all(assert_right(f) for f in files)
    assert assert_right(ckpt.last()) == saved
    assert not list(ckpt.path.glob(".*.tmp"))  # the torn temp file was removed

    _mount("-o", "remount,ro", str(tmpfs))
    try:
        with pytest.raises(CheckpointError, match="Read-only file system") as e:
            ckpt.save(payload(saved + 1, 10), saved + 1)
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.EROFS
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert assert_right(ckpt.last()) == saved
    finally:
        _mount("-o", "remount,rw", str(tmpfs))


def test_a_full_disk_while_writing_over_a_dropped_file_damages_nothing(tmpfs):
    # inside a fit a save writes over the file rotation dropped: one that outgrows it on
    # a full disk is a CheckpointError, the spare is deleted, the checkpoints are intact
    ckpt = st.Checkpointing(tmpfs / "ckpt", keep=2)
    numel = 60_000  # 240 kB a file: three fit in 1 MiB, with room for a little more
    with ckptdir.writer(ckpt.path):
        for step in range(1, 5):
            ckpt.save(payload(step, numel), step)
        (spare,) = [n for n in os.listdir(ckpt.path) if ckptspare.SPARE.match(n)]
        with pytest.raises(CheckpointError, match=r"step-000000005\.ckpt: No space left") as e:
            ckpt.save(payload(5, 3 * numel), 5)
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
        assert not (ckpt.path / spare).exists() and not ckpt.file(5).exists()
        assert [assert_right(f) for f in sorted(ckpt.path.glob("step-*.ckpt"))] == [3, 4]
        assert assert_right(ckpt.last()) == 4
        ckpt.save(payload(5, numel), 5)  # the room the spare held serves the next save
        assert assert_right(ckpt.last()) == 5
