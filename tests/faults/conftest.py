"""The fault-injection suite: processes killed mid-write, damaged files, full disks, lost workers.

Each test injects a fault ``TRIALS`` times at random instants or places (a seeded RNG:
a failure names its seed) and asserts that nothing acknowledged is lost and no wrong
value is ever returned. ``make test`` runs a few trials of each; ``make faults`` runs
many (``SOMATIZE_FAULT_TRIALS``, default 3 here).
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

TRIALS = max(int(os.environ.get("SOMATIZE_FAULT_TRIALS", "3")), 1)
SEED = int(os.environ.get("SOMATIZE_FAULT_SEED", "20261201"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A seeded RNG per test (the seed is printed on failure with -ra)."""
    return random.Random(f"{SEED}:{request.node.nodeid}")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted at a temp dir (skipped where mounting is not allowed)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0777", "tmpfs", str(mount)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        err = getattr(e, "stderr", b"") or b""
        pytest.skip(f"cannot mount a tmpfs here ({e} {err.decode(errors='replace').strip()})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True, timeout=30)
