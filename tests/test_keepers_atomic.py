"""``somatize/keepers/atomic.py``: both atomic writers create files as ``open(p, "w")``
would, mode 0o666 less the umask (mkstemp's 0600 and a fixed 0644 broke shared stores)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from somatize import DiskKeeper
from somatize.keepers.atomic import atomic_write, replace_with


@pytest.fixture(params=[0o022, 0o002, 0o077])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_both_writers_honour_the_umask_as_a_plain_open_does(tmp_path: Path, umask: int) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    atomic_write(tmp_path / "a", b"x")
    replace_with(str(tmp_path / "b"), [b"x"])
    assert mode(plain) == 0o666 & ~umask
    assert mode(tmp_path / "a") == mode(plain)
    assert mode(tmp_path / "b") == mode(plain)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "plain"]  # no temp left


def test_a_disk_keepers_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    keeper = DiskKeeper(tmp_path / "cache")
    key = "a" * 64
    keeper.put(key, b"data")
    keeper.put_many([("b" * 64, b"one"), ("c" * 64, b"two")])
    keeper.name("best", key)
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert len(files) >= 3
    assert {oct(mode(p)) for p in files} == {oct(0o666 & ~umask)}
