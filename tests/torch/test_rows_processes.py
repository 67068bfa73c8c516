"""Per-example memory across processes: a shared DiskKeeper, and SIGKILL during writes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from somatize import DiskKeeper

from .scripts import rows_worker

SCRIPT = Path(rows_worker.__file__)
pytestmark = pytest.mark.slow


def start(env, *args) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, str(SCRIPT), *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def finish(p: subprocess.Popen) -> str:
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    return out.strip()


def reference(x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    enc = rows_worker.Enc()
    with torch.no_grad():
        return enc.net.eval()(x)


def test_processes_sharing_a_disk_keeper_compute_each_example_once(tmp_path, subprocess_env):
    cache = tmp_path / "cache"
    assert finish(start(subprocess_env, cache, 0, 64)) == "computed 64"
    assert finish(start(subprocess_env, cache, 32, 96)) == "computed 32"  # 32..63 were stored
    both = [start(subprocess_env, cache, 96, 160) for _ in range(2)]  # racing on the same rows
    counts = sorted(int(finish(p).split()[1]) for p in both)
    assert counts[1] == 64 and 0 <= counts[0] <= 64  # one computed them; the other maybe too
    assert finish(start(subprocess_env, cache, 0, 160)) == "computed 0"
    g = rows_worker.graph(str(cache))
    assert_close(g.forward(rows_worker.DATA[:160]), reference(rows_worker.DATA[:160]))
    assert rows_worker.Enc.rows == 0 and DiskKeeper(cache).verify() == []


def test_sigkill_during_per_example_writes_never_leaves_a_torn_hit(tmp_path, subprocess_env):
    trials = int(os.environ.get("SOMATIZE_FAULT_TRIALS", "3"))
    rng = random.Random(0)
    cache = tmp_path / "cache"
    written = 0
    for _ in range(trials):
        p = start(subprocess_env, cache, "--forever")
        time.sleep(rng.uniform(0.05, 0.5))  # somewhere in the middle of writing batches
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL
        done = [int(line.split()[1]) for line in out.splitlines() if line.startswith("batch")]
        written = max(written, max(done, default=-1) + 1)
    assert DiskKeeper(cache).verify() == []  # nothing torn is visible as an entry
    g = rows_worker.graph(str(cache))
    for i in range(written + 2):  # every stored batch, plus ones a kill may have cut short
        x = rows_worker.batch_rows(i)
        rows_worker.Enc.rows = 0
        assert_close(g.forward(x), reference(x))  # a hit is always the right value
        if i < written:
            assert rows_worker.Enc.rows == 0  # a batch reported stored is remembered whole
