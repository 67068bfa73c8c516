"""Several processes' ``gc`` at once on one store (a sweep's bounded handles, ``somatize
cache gc`` during a run): together they shrink it to the bound, not each by the excess
the store showed before any of them removed anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from somatize import DiskKeeper

try:
    import fcntl
except ImportError:  # (Windows: no lock, nothing to race on)
    fcntl = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(fcntl is None, reason="gc's lock is an flock")

PACK = 1_900  # bytes of one batch's pack on disk (10 entries of 100 bytes), at most

CHILD = """
import os, sys
from somatize import DiskKeeper
root, role, budget, me = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "gc":
    print(DiskKeeper(root).gc(budget))
else:  # a bounded handle: its first write gcs the store down to the bound
    k = DiskKeeper(root, max_bytes=budget)
    k.put_many([("%064x" % (10**6 + 100 * me + i), os.urandom(100)) for i in range(10)])
"""


def fill(root: Path, batches: int) -> int:
    keeper = DiskKeeper(root)
    for b in range(batches):
        keeper.put_many([(f"{b * 10 + i:064x}", os.urandom(100)) for i in range(10)])
    return keeper.stats().bytes


def waiters(lock: Path) -> int:
    """How many processes wait for an flock on ``lock`` (/proc/locks; -1 where unknown)."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return -1
    ino = f":{os.stat(lock).st_ino}"
    return sum("->" in line and any(f.endswith(ino) for f in line.split()) for line in lines)


def at_once(root: Path, role: str, budget: int, env: dict[str, str]) -> None:
    """Three children doing ``role`` on ``root``: held at gc's lock until all three have
    read the store (the way gcs started together run), then let go."""
    lock = root / "pins" / ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a gc that is removing
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), role, str(budget), str(me)], env=env
        )
        for me in range(3)
    ]
    try:
        deadline = time.monotonic() + 60
        while waiters(lock) not in (-1, 3) and time.monotonic() < deadline:
            time.sleep(0.05)
        if waiters(lock) == -1:  # (no /proc/locks: give them time to reach the lock)
            time.sleep(2.0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    finally:
        os.close(fd)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_three_gcs_at_once_leave_the_store_at_the_bound_not_empty(tmp_path, subprocess_env):
    total = fill(tmp_path, 60)
    budget = total // 2
    at_once(tmp_path, "gc", budget, subprocess_env)
    after = DiskKeeper(tmp_path).stats().bytes
    assert budget - 2 * PACK <= after <= budget  # (before: 0, each gc removing half the store)


def test_three_bounded_handles_starting_together_keep_the_store_near_the_bound(
    tmp_path, subprocess_env
):
    bound = 40_000
    fill(tmp_path, 50)  # 1.25 times the bound, left by an earlier sweep
    at_once(tmp_path, "bounded", bound, subprocess_env)
    after = DiskKeeper(tmp_path).stats().bytes
    assert bound - 2 * PACK <= after <= bound + 3 * 2 * PACK  # (before: 0.6-0.9 of it)
