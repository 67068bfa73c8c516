"""Keepers: bytes under content keys, in memory (LRU by bytes) and on disk (a content store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from somatize import DiskKeeper, Keeper, MemoryKeeper
from somatize.errors import KeeperError
from somatize.keepers import loose
from tests.keeper_keys import k

# -- the protocol -------------------------------------------------------------------------


@pytest.fixture(params=["memory", "disk"])
def keeper(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryKeeper | DiskKeeper:
    return MemoryKeeper() if request.param == "memory" else DiskKeeper(tmp_path / "store")


def test_both_keepers_fit_the_protocol(keeper: MemoryKeeper | DiskKeeper) -> None:
    assert isinstance(keeper, Keeper)
    assert keeper.get(k(1)) is None
    keeper.put(k(1), b"one")
    assert keeper.get(k(1)) == b"one"
    keeper.put(k(1), b"uno")  # overwrite
    assert keeper.get(k(1)) == b"uno"
    keeper.name("first", k(1))
    assert keeper.lookup("first") == b"uno"
    assert keeper.lookup("absent") is None
    with pytest.raises(KeeperError, match="64 lowercase hex digits"):
        keeper.put("not-a-key", b"x")
    with pytest.raises(KeeperError, match="invalid name"):
        keeper.name("../escape", k(1))
    with pytest.raises(OSError):  # KeeperError is an OSError
        keeper.put("A" * 64, b"x")
    assert keeper.stats().entries == 1 and keeper.stats().names == 1


def test_a_bad_key_or_name_is_shown_shortened_with_its_type_and_an_example() -> None:
    keeper = MemoryKeeper()
    with pytest.raises(KeeperError, match=r"invalid key b'ab.*' \(a bytes\): .*somatize\.digest"):
        keeper.put(b"ab" * 32, b"x")  # type: ignore[arg-type]
    with pytest.raises(KeeperError) as info:
        keeper.put("x" * 10_000, b"x")
    assert len(str(info.value)) < 300  # the key shortened, not 10,000 characters
    with pytest.raises(KeeperError, match=r"invalid name '\.x': .*e\.g\. 'features-v1'"):
        keeper.name(".x", k(1))


# -- MemoryKeeper -------------------------------------------------------------------------


def test_memory_keeper_evicts_least_recently_used_by_bytes() -> None:
    keeper = MemoryKeeper(max_bytes=30)
    for i in range(3):
        keeper.put(k(i), b"x" * 10)
    assert len(keeper) == 3 and keeper.stats().bytes == 30
    keeper.get(k(0))  # now the most recent
    keeper.put(k(3), b"y" * 10)
    assert k(1) not in keeper  # the least recently used went
    assert all(key in keeper for key in (k(0), k(2), k(3)))
    keeper.put(k(4), b"z" * 25)  # big: evicts until it fits
    assert keeper.stats().bytes <= 30 and k(4) in keeper


def test_memory_keeper_keeps_pinned_entries_and_gc() -> None:
    keeper = MemoryKeeper(max_bytes=35)
    keeper.put(k(0), b"p" * 10, pinned=True)  # the oldest, but pinned
    for i in range(1, 6):
        keeper.put(k(i), b"x" * 10)
    assert [key for key in (k(0), k(1), k(2), k(3), k(4), k(5)) if key in keeper] == [
        k(0),
        k(4),
        k(5),
    ]
    keeper.pin(k(5))
    assert keeper.gc(0) == 10  # only k(4) could go
    assert len(keeper) == 2 and k(0) in keeper and k(5) in keeper
    stats = keeper.stats()
    assert (stats.entries, stats.bytes, stats.pinned) == (2, 20, 2)
    assert (stats.evicted, stats.evicted_bytes) == (4, 40)  # 1, 2, 3 for the budget; 4 by gc
    assert str(stats) == "2 entries, 20 bytes, 2 pinned, 0 names, 4 evicted (40 bytes)"


def test_memory_keeper_stores_a_copy_of_the_bytes() -> None:
    keeper = MemoryKeeper()
    data = bytearray(b"abc")
    keeper.put(k(0), data)  # type: ignore[arg-type]
    data[0] = ord("z")
    assert keeper.get(k(0)) == b"abc"


# -- DiskKeeper ---------------------------------------------------------------------------


def entry_file(keeper: DiskKeeper, key: str) -> Path:
    return keeper.path / "objects" / key[:2] / key


def test_disk_keeper_layout_names_and_listing(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"one")
    keeper.put(k(2), b"two", pinned=True)
    keeper.name("best", k(2))
    assert entry_file(keeper, k(1)).exists()
    assert list(keeper.keys()) == [k(1), k(2)]
    assert keeper.names() == {"best": k(2)}
    assert keeper.lookup("best") == b"two"
    stats = keeper.stats()
    assert (stats.entries, stats.pinned, stats.names) == (2, 1, 1)
    assert stats.bytes > len(b"one") + len(b"two")  # headers with checksums included
    again = DiskKeeper(tmp_path / "store")  # another handle (or process) sees the same store
    assert again.get(k(1)) == b"one" and again.lookup("best") == b"two"
    assert repr(again) == f"DiskKeeper({str(tmp_path / 'store')!r})"


@pytest.mark.parametrize("damage", ["flip-payload", "flip-header", "truncate", "extend", "empty"])
def test_a_corrupt_entry_is_a_miss_and_verify_removes_it(tmp_path: Path, damage: str) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"payload bytes")
    keeper.put(k(2), b"healthy")
    file = entry_file(keeper, k(1))
    raw = bytearray(file.read_bytes())
    if damage == "flip-payload":
        raw[-3] ^= 0x40
    elif damage == "flip-header":
        raw[10] ^= 0x01
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "extend":
        raw += b"!"
    else:
        raw = bytearray()
    file.write_bytes(bytes(raw))
    assert keeper.verify() == [k(1)]
    assert keeper.get(k(1)) is None
    assert keeper.get(k(2)) == b"healthy"
    file.write_bytes(bytes(raw))  # damage again: get alone also refuses it, and removes it
    assert keeper.get(k(1)) is None
    assert not file.exists()
    keeper.put(k(1), b"payload bytes")
    assert keeper.get(k(1)) == b"payload bytes"


@pytest.mark.parametrize(
    ("before", "call"), [("absent", "get"), ("corrupt", "get"), ("corrupt", "verify")]
)
def test_a_reader_never_removes_an_entry_another_process_just_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str, call: str
) -> None:
    reader, writer = DiskKeeper(tmp_path / "store"), DiskKeeper(tmp_path / "store")
    if before == "corrupt":
        writer.put(k(1), b"good")
        file = entry_file(writer, k(1))
        file.write_bytes(file.read_bytes()[:-1])
    real_read = loose.read

    def read_then_race(file: str) -> tuple[bytes | None, int]:
        seen = real_read(file)
        writer.put(k(1), b"good")  # lands between the reader's read and its clean-up
        return seen

    monkeypatch.setattr(loose, "read", read_then_race)
    if call == "get":
        assert reader.get(k(1)) is None  # what it read was absent or corrupt...
    else:
        assert reader.verify() == [k(1)]
    assert writer.get(k(1)) == b"good"  # ...but the entry written meanwhile stays


def test_gc_removes_least_recently_used_unpinned_entries(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    for i in range(5):
        keeper.put(k(i), bytes(100), pinned=(i == 0))
        os.utime(entry_file(keeper, k(i)), (1_000_000 + i, 1_000_000 + i))  # 0 oldest
    size = entry_file(keeper, k(1)).stat().st_size
    keeper.get(k(1))  # read: now the most recent
    freed = keeper.gc(3 * size)
    assert freed == 2 * size
    assert sorted(keeper.keys()) == [k(0), k(1), k(4)]  # pinned 0 kept; 2 and 3 went
    assert keeper.gc(0) == 2 * size
    assert list(keeper.keys()) == [k(0)]
    assert keeper.get(k(0)) == bytes(100)


def test_gc_removes_only_stale_temp_files(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"x")
    folder = entry_file(keeper, k(1)).parent
    fresh, stale = folder / f".{k(2)}.abc.tmp", folder / f".{k(3)}.def.tmp"
    fresh.write_bytes(b"half-writ")
    stale.write_bytes(b"left by a killed writer")
    os.utime(stale, (1_000_000, 1_000_000))
    assert list(keeper.keys()) == [k(1)]  # temp files are never entries
    keeper.gc(1 << 30)
    assert fresh.exists() and not stale.exists()
    assert keeper.get(k(1)) == b"x"


def test_gc_and_stats_tolerate_files_vanishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"x")
    real_scan = loose.scan

    class Ghost:  # listed, but removed by another process before its stat()
        name, path = k(9), str(entry_file(keeper, k(9)))

        def is_file(self, follow_symlinks: bool = True) -> bool:
            return True  # (the listing's file type)

        def stat(self, follow_symlinks: bool = True) -> os.stat_result:
            raise FileNotFoundError(self.path)

    def scan(root: str):  # type: ignore[no-untyped-def]
        yield from real_scan(root)
        yield Ghost()

    monkeypatch.setattr(loose, "scan", scan)
    assert keeper.stats().entries == 1
    assert keeper.gc(1 << 30) == 0
    assert keeper.gc(0) > 0 and keeper.stats().entries == 0
