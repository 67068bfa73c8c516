"""DiskKeeper packs: batches in one file, found by other processes, verified, gc'd whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from somatize import DiskKeeper
from somatize.keepers import packs


def k(i: int) -> str:
    return f"{i:064x}"


def pack_files(keeper: DiskKeeper) -> list[Path]:
    return sorted(p for p in (keeper.path / "packs").iterdir() if p.name.endswith(".pack"))


def rows(start: int, n: int, size: int = 145) -> list[tuple[str, bytes]]:
    return [(k(i), (b"%d;" % i * size)[:size]) for i in range(start, start + n)]


def test_a_batch_is_one_file_and_small_entries_cost_little_disk(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 1000))
    (pack,) = pack_files(keeper)
    per_entry = pack.stat().st_size / 1000
    assert per_entry < 145 + 100  # header and checksum: 80 bytes an entry, not a 4 KB block
    assert not list((keeper.path / "objects").iterdir())
    stats = keeper.stats()
    assert (stats.entries, stats.packs, stats.bytes) == (1000, 1, pack.stat().st_size)
    assert list(keeper.keys()) == [k(i) for i in range(1000)]


def test_a_huge_batch_is_split_into_packs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("somatize.keepers.disk_keeper.MAX_PACK_BYTES", 1000)
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 20, size=300))  # 6000 bytes: three entries a pack
    assert len(pack_files(keeper)) == 7
    assert keeper.get_many([k(i) for i in range(20)]) == [v for _, v in rows(0, 20, size=300)]


def test_another_process_finds_packs_written_after_it_looked(tmp_path: Path) -> None:
    reader, writer = DiskKeeper(tmp_path / "store"), DiskKeeper(tmp_path / "store")
    assert reader.get_many([k(1)]) == [None]  # the reader has listed packs/ already
    writer.put_many(rows(0, 5))
    writer.put_many(rows(5, 5))
    assert reader.get_many([k(1), k(7)]) == [rows(1, 1)[0][1], rows(7, 1)[0][1]]
    assert reader.get(k(9)) == rows(9, 1)[0][1]
    assert reader.stats().entries == 10


def counting_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every scandir of a packs/ directory, recorded."""
    listed: list[str] = []
    real = os.scandir

    def scandir(path: str) -> object:
        if str(path).endswith("packs"):
            listed.append(str(path))
        return real(path)

    monkeypatch.setattr(packs.os, "scandir", scandir)
    return listed


def test_a_writer_does_not_relist_packs_for_every_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a cold epoch: a lookup that misses, then a pack, per batch; each pack moves the mtime
    monkeypatch.setattr(packs, "RELIST_SHARE", 4)
    keeper = DiskKeeper(tmp_path / "store")
    listed = counting_listings(monkeypatch)
    for b in range(60):
        assert keeper.get_many([k(10 * b + i) for i in range(10)]) == [None] * 10
        keeper.put_many(rows(10 * b, 10))
        assert keeper.get_many([k(10 * b), k(0)]) == [rows(10 * b, 1)[0][1], rows(0, 1)[0][1]]
    # a relisting every max(1, packs // 4) lookups: 24 here; relisting at every lookup
    # that found the directory changed made 120
    assert len(listed) <= 40 and len(pack_files(keeper)) == 60


def test_a_pack_another_process_wrote_is_found_within_its_share_of_lookups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packs, "RELIST_SHARE", 4)
    writer, reader = DiskKeeper(tmp_path / "store"), DiskKeeper(tmp_path / "store")
    for b in range(20):
        writer.put_many(rows(10 * b, 10))
    assert reader.get_many([k(0)]) == [rows(0, 1)[0][1]]  # the reader lists the 20 packs
    writer.put_many(rows(1000, 1))
    found = [reader.get_many([k(1000)])[0] for _ in range(20 // 4 + 1)]
    assert found[-1] == rows(1000, 1)[0][1]  # found within packs // 4 + 1 lookups
    writer.put_many(rows(2000, 1))
    assert reader.stats().entries == 202  # a forced refresh relists at once
    assert reader.get_many([k(2000)]) == [rows(2000, 1)[0][1]]
    writer.put_many(rows(3000, 1))
    writer.name("latest", k(3000))
    assert reader.lookup("latest") == rows(3000, 1)[0][1]  # a name is followed at once


def test_a_reader_follows_a_pack_that_gc_rewrote(tmp_path: Path) -> None:
    reader, tender = DiskKeeper(tmp_path / "store"), DiskKeeper(tmp_path / "store")
    tender.put_many(rows(0, 4))
    assert reader.get(k(0)) is not None  # indexed in the reader
    tender.pin(k(2))
    tender.gc(0)  # the pack goes, but k(2) is pinned: rewritten as a pinned pack of one
    assert reader.get_many([k(0), k(2)]) == [None, rows(2, 1)[0][1]]
    assert reader.stats().pinned == 1


def test_a_key_in_two_packs_is_found_in_the_other_when_one_goes(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many([(k(1), b"one"), (k(2), b"two")])
    keeper.put_many([(k(1), b"one"), (k(3), b"three")])  # a later batch repeats k(1)
    for handle in (keeper, DiskKeeper(tmp_path / "store")):
        assert handle.get_many([k(1), k(2), k(3)]) == [b"one", b"two", b"three"]
    keeper.discard(k(2))  # rewrites the first pack without k(2): k(1) moves
    keeper.discard(k(3))  # and the second without k(3)
    assert keeper.get_many([k(1), k(2), k(3)]) == [b"one", None, None]
    assert DiskKeeper(tmp_path / "store").get_many([k(1)]) == [b"one"]
    assert keeper.stats().entries == 1


def test_packs_sharing_keys_removed_by_another_process_are_misses_not_a_key_error(
    tmp_path: Path,
) -> None:
    a = DiskKeeper(tmp_path / "store")
    a.put_many(rows(0, 10))
    a.put_many(rows(5, 10))  # rows 5-9 in both packs
    a.put_many(rows(0, 10))  # the first batch again: the same pack, indexed anew
    keys = [k(i) for i in range(15)]
    assert None not in a.get_many(keys)
    assert DiskKeeper(tmp_path / "store").gc(0) > 0  # another process removes both packs
    assert a.get_many(keys) == [None] * 15  # dropping both: no KeyError
    a.put_many(rows(0, 3))  # and the index still works
    assert a.get_many(keys[:4]) == [v for _, v in rows(0, 3)] + [None]


@pytest.mark.parametrize("where", ["payload", "checksum", "index", "truncate"])
def test_a_damaged_pack_is_a_miss_and_verify_cleans_it(tmp_path: Path, where: str) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 3))
    (pack,) = pack_files(keeper)
    raw = bytearray(pack.read_bytes())
    first = packs.HEAD.size + 3 * packs.SLOT.size  # the first entry's checksum
    if where == "payload":
        raw[first + packs.CHECK + 5] ^= 0x01
    elif where == "checksum":
        raw[first] ^= 0x80
    elif where == "index":
        raw[packs.HEAD.size + 40] ^= 0x01  # the offset of the first entry
    else:
        raw = raw[:-10]  # the last entry is cut short
    pack.write_bytes(bytes(raw))
    fresh = DiskKeeper(tmp_path / "store")
    got = fresh.get_many([k(0), k(1), k(2)])
    good = [v for _, v in rows(0, 3)]
    if where == "index":  # nothing in it can be trusted
        assert got == [None, None, None]
        assert fresh.verify() == [f"packs/{pack.name}"]
    else:
        bad = 2 if where == "truncate" else 0
        assert got == [None if i == bad else good[i] for i in range(3)]
        # the get already rewrote the pack without the bad entry
        assert DiskKeeper(tmp_path / "store").verify() == []
        assert fresh.get_many([k(0), k(1), k(2)]) == got
    assert not pack.exists()


def test_verify_of_packs_reports_each_bad_entry(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 3))
    (pack,) = pack_files(keeper)
    raw = bytearray(pack.read_bytes())
    raw[-1] ^= 0x01  # the last entry's payload
    pack.write_bytes(bytes(raw))
    assert DiskKeeper(tmp_path / "store").verify() == [k(2)]
    assert keeper.get_many([k(0), k(2)]) == [rows(0, 1)[0][1], None]


def test_verify_with_a_decoder_removes_what_does_not_decode(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many([(k(0), b"1"), (k(1), b"x"), (k(2), b"2")])
    keeper.put(k(3), b"y")
    keeper.put(k(4), b"4")
    assert keeper.verify() == []  # the checksums hold
    assert sorted(keeper.verify(int)) == [k(1), k(3)]
    assert keeper.get_many([k(i) for i in range(5)]) == [b"1", None, b"2", None, b"4"]
    assert keeper.verify(int) == []


def test_gc_drops_whole_packs_least_recent_first_and_keeps_pinned_ones(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 10), pinned=True)
    for n in range(1, 4):
        keeper.put_many(rows(10 * n, 10))
    keeper.put(k(100), bytes(100))
    by_first = {}
    for p in pack_files(keeper):
        by_first[DiskKeeper(tmp_path / "store")._index.load(p.name).keys[0]] = p  # type: ignore[union-attr]
    for age, first in enumerate([k(10), k(0), k(20), k(30)]):  # k(10)'s pack the oldest
        os.utime(by_first[first], (1_000_000 + age, 1_000_000 + age))
    os.utime(keeper.path / "objects" / k(100)[:2] / k(100), (1_000_010, 1_000_010))
    size = by_first[k(20)].stat().st_size
    total = keeper.stats().bytes
    freed = keeper.gc(total - 1)  # one pack must go: the oldest unpinned one
    assert freed == size
    assert keeper.get_many([k(10), k(0), k(20)]) == [None, rows(0, 1)[0][1], rows(20, 1)[0][1]]
    freed = keeper.gc(0)  # all but the pinned pack
    assert keeper.stats().entries == 10 and keeper.stats().pinned == 10
    assert len(pack_files(keeper)) == 1


def test_unpin_of_a_packed_entry_lets_gc_take_it(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 4), pinned=True)
    keeper.unpin_many([k(0), k(1)])
    assert keeper.stats().pinned == 2
    keeper.gc(0)
    assert keeper.get_many([k(i) for i in range(4)]) == [None, None] + [v for _, v in rows(2, 2)]


KILLED = textwrap.dedent(
    """
    import os, sys
    from somatize import DiskKeeper

    keeper, mode = DiskKeeper(sys.argv[1]), sys.argv[2]
    if mode == "pause":  # stop inside the write: after the bytes, before the rename
        real_replace = os.replace

        def replace(src, dst):
            print("paused", flush=True)
            sys.stdin.readline()  # the parent kills us while we wait here
            real_replace(src, dst)

        os.replace = replace
    n = int(sys.argv[3])
    while True:
        batch = [("%064x" % (n * 50 + i), (b"%d:" % (n * 50 + i)) * 2000) for i in range(50)]
        print(n, flush=True)
        keeper.put_many(batch)
        n = (n + 1) % 8
    """
)


@pytest.mark.slow
def test_a_batch_writer_killed_mid_write_never_leaves_a_torn_hit(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    store = tmp_path / "store"
    keeper = DiskKeeper(store)
    keys = [k(i) for i in range(400)]
    for n, mode in enumerate(["pause", "random", "pause", "random", "random", "pause"]):
        before = DiskKeeper(store).get_many(keys[n * 50 : n * 50 + 50])
        proc = subprocess.Popen(
            [sys.executable, str(script), str(store), mode, str(n)],
            env=subprocess_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdin is not None
        if mode == "pause":
            assert proc.stdout.readline().strip() == str(n)
            assert proc.stdout.readline().strip() == "paused"
        else:
            for _ in range(2 + n):  # kill somewhere in a later batch
                proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stdin.close()
        assert proc.returncode == -signal.SIGKILL
        if mode == "pause":  # the batch's bytes were in a temp file never renamed: invisible
            assert list((store / "packs").glob(".*.tmp"))
            assert DiskKeeper(store).get_many(keys[n * 50 : n * 50 + 50]) == before
        for key, got in zip(keys, DiskKeeper(store).get_many(keys), strict=True):
            assert got is None or got == (b"%d:" % int(key, 16)) * 2000, f"{key} is torn"
        assert keeper.verify() == []
    assert all(v is not None for v in keeper.get_many(keys[50:100]))  # the first random round
