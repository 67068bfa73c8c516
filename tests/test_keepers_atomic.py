"""``somatize/keepers/atomic.py`` and what its writers leave: both atomic writers create
files as ``open(p, "w")`` would, mode 0o666 less the umask (mkstemp's 0600 and a fixed
0644 broke shared stores); ``gc`` removes the temp files a killed writer left anywhere;
``start_writeback`` is a hint that never fails."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from somatize import DiskKeeper
from somatize.keepers import atomic
from somatize.keepers.atomic import atomic_write, replace_with, start_writeback


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


def test_gc_removes_old_temp_files_in_names_pins_and_notes_but_not_fresh_ones(
    tmp_path: Path,
) -> None:
    keeper = DiskKeeper(tmp_path / "cache")
    keeper.put("a" * 64, b"data")
    old, fresh = [], []
    for folder in ("names", "pins", "notes", "packs"):
        d = tmp_path / "cache" / folder
        d.mkdir(exist_ok=True)
        for name, into in ((f".x.{folder}.7-0.tmp", old), (f".x.{folder}.8-0.tmp", fresh)):
            (d / name).write_bytes(b"torn")
            into.append(d / name)
    for p in old:
        os.utime(p, (1, 1))  # left by a writer killed long ago
    keeper.gc(10**9)
    assert [p.exists() for p in old] == [False] * 4
    assert [p.exists() for p in fresh] == [True] * 4  # perhaps a live writer's
    assert keeper.get("a" * 64) == b"data"


def test_start_writeback_is_bound_on_linux_changes_nothing_and_never_raises(
    tmp_path: Path,
) -> None:
    assert (atomic._sync_file_range() is not None) == sys.platform.startswith("linux")
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 10_000)
        start_writeback(fd, 0, 10_000)
        start_writeback(fd, 4096, 0)  # 0: to the end of the file
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 10_000
    start_writeback(fd, 0, 10)  # a closed descriptor: EBADF, left to an fsync to report
