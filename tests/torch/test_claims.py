"""A run's claim on its log folder: atomic, released by close, by a killed process's death,
and not held on by a forked child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings

import pytest

from somatize.torch.claims import claim

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock: POSIX only")


def test_a_second_claim_on_a_held_folder_is_busy_until_the_first_is_released(tmp_path):
    first, busy = claim(str(tmp_path))
    assert first is not None and not busy
    second, busy = claim(str(tmp_path))  # (a second writer in this process: its own open file)
    assert second is None and busy
    assert claim(str(tmp_path / "other"))[1] is False  # (no folder: nothing to claim)
    first.release()
    first.release()  # (once; later calls do nothing)
    third, busy = claim(str(tmp_path))
    assert third is not None and not busy
    third.release()
    assert os.listdir(tmp_path) == []  # no marker file left


def test_a_killed_process_leaves_no_claim_behind(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from somatize.torch.claims import claim; "
         "c, busy = claim(sys.argv[1]); print(c is not None, busy, flush=True); sys.stdin.read()",
         str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().split() == ["True", "False"]  # it holds the folder
        assert claim(str(tmp_path)) == (None, True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
    mine, busy = claim(str(tmp_path))  # its claim died with it; no marker file says otherwise
    assert mine is not None and not busy and os.listdir(tmp_path) == []
    mine.release()


def test_a_forked_child_does_not_hold_its_parents_claim_on(tmp_path):
    """A DataLoader worker forked during a fit must not keep the folder claimed after it."""
    held, _ = claim(str(tmp_path))
    read, write = os.pipe()  # the parent says when the child may exit
    ready_read, ready_write = os.pipe()  # the child says it runs (its fork hooks have run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (fork with threads, 3.12+)
        pid = os.fork()
    if pid == 0:  # the child: alive until the parent is done
        os.close(write)
        os.write(ready_write, b"1")
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    os.close(ready_write)
    try:
        assert os.read(ready_read, 1) == b"1"
        held.release()
        again, busy = claim(str(tmp_path))  # the child still lives, with its copies closed
        assert again is not None and not busy
        again.release()
    finally:
        os.close(write)
        os.close(ready_read)
        os.waitpid(pid, 0)
