"""DiskKeeper's read cache: whole packs read once and kept verified, within a budget."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import pytest

from somatize import DiskKeeper
from somatize.keepers import packread, packs


def k(i: int) -> str:
    return f"{i:064x}"


def rows(start: int, n: int, size: int = 100) -> list[tuple[str, bytes]]:
    return [(k(i), (b"%d;" % i * size)[:size]) for i in range(start, start + n)]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of entries each read of a pack asked for, one item per read."""
    seen: list[int] = []
    real, real_every = packread.entries, packread.every_entry

    def counted(fd: int, size: int, wanted: list[tuple[int, int]]) -> list[bytes | None]:
        seen.append(len(wanted))
        return real(fd, size, wanted)

    def every(fd: int, size: int, pack: packs.Pack) -> list[bytes | None]:
        seen.append(len(pack.slots))
        return real_every(fd, size, pack)

    monkeypatch.setattr(packread, "entries", counted)
    monkeypatch.setattr(packread, "every_entry", every)
    return seen


def store(tmp_path: Path, packs: int = 4) -> list[tuple[str, bytes]]:
    writer = DiskKeeper(tmp_path / "store", read_cache=0)
    written: list[tuple[str, bytes]] = []
    for p in range(packs):
        batch = rows(10 * p, 10)
        writer.put_many(batch)
        written += batch
    return written


def test_a_store_that_fits_is_read_once_pack_by_pack(tmp_path: Path, reads: list[int]) -> None:
    written = store(tmp_path)
    reader = DiskKeeper(tmp_path / "store")
    shuffled = [written[i] for i in (3, 17, 25, 38, 0, 11)]
    assert reader.get_many([key for key, _ in shuffled]) == [v for _, v in shuffled]
    assert reads == [10, 10, 10, 10]  # each pack touched is read whole, once
    everything = reader.get_many([key for key, _ in written])
    assert everything == [v for _, v in written]
    assert reader.get(written[5][0]) == written[5][1]
    assert reads == [10, 10, 10, 10]  # the rest came from memory: no file read again


def test_a_store_bigger_than_the_budget_reads_only_the_rows_asked(
    tmp_path: Path, reads: list[int]
) -> None:
    written = store(tmp_path)  # 4000 bytes of entries
    reader = DiskKeeper(tmp_path / "store", read_cache=3000)
    assert reader.get_many([written[3][0], written[17][0]]) == [written[3][1], written[17][1]]
    assert reader.get_many([written[3][0]]) == [written[3][1]]
    assert reads == [1, 1, 1]  # never a whole pack for one row, nothing kept


def test_read_cache_zero_keeps_nothing(tmp_path: Path, reads: list[int]) -> None:
    written = store(tmp_path, packs=1)
    reader = DiskKeeper(tmp_path / "store", read_cache=0)
    for _ in range(2):
        assert reader.get_many([written[2][0]]) == [written[2][1]]
    assert reads == [1, 1]


def test_what_a_handle_writes_is_read_back_from_memory(tmp_path: Path, reads: list[int]) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 10))
    assert keeper.get_many([k(4), k(9)]) == [rows(4, 1)[0][1], rows(9, 1)[0][1]]
    assert reads == []


def test_a_discarded_entry_leaves_the_cache(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many(rows(0, 3))
    keeper.discard(k(1))  # did not decode: the pack is rewritten without it
    assert keeper.get_many([k(0), k(1), k(2)]) == [rows(0, 1)[0][1], None, rows(2, 1)[0][1]]


def test_packs_another_process_removed_leave_the_cache(tmp_path: Path) -> None:
    written = store(tmp_path, packs=2)
    reader = DiskKeeper(tmp_path / "store")
    assert reader.get_many([written[0][0]]) == [written[0][1]]  # its pack is kept
    DiskKeeper(tmp_path / "store").gc(0)  # another handle frees everything
    assert reader.get_many([written[0][0], written[15][0]]) == [None, None]


def test_a_pack_with_a_damaged_entry_is_not_kept(tmp_path: Path, reads: list[int]) -> None:
    store(tmp_path, packs=1)
    (pack,) = (tmp_path / "store" / "packs").glob("*.pack")
    raw = bytearray(pack.read_bytes())
    raw[-1] ^= 0x01  # the last entry's payload
    pack.write_bytes(bytes(raw))
    reader = DiskKeeper(tmp_path / "store")
    got = reader.get_many([k(0), k(9)])
    assert got == [rows(0, 1)[0][1], None]  # the damaged entry is a miss, never returned
    assert reader.get_many([k(0)]) == [rows(0, 1)[0][1]]  # from the rewritten pack, on disk
    assert len(reads) == 2


def test_a_pickled_handle_keeps_its_budget(tmp_path: Path, reads: list[int]) -> None:
    written = store(tmp_path, packs=1)
    copy = pickle.loads(pickle.dumps(DiskKeeper(tmp_path / "store", read_cache=0)))
    for _ in range(2):
        assert copy.get_many([written[1][0]]) == [written[1][1]]
    assert reads == [1, 1]


def test_a_pack_read_whole_is_verified_by_one_checksum_or_entry_by_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store(tmp_path, packs=2)
    first, _ = sorted((tmp_path / "store" / "packs").glob("*.pack"))
    raw = bytearray(first.read_bytes())
    raw[-1] ^= 0x01  # one payload: the data checksum fails, the others' own checksums hold
    first.write_bytes(bytes(raw))
    per_entry: list[int] = []
    real = packs.entries

    def counted(fd: int, size: int, wanted: list[tuple[int, int]]) -> list[bytes | None]:
        per_entry.append(len(wanted))
        return real(fd, size, wanted)

    monkeypatch.setattr(packs, "entries", counted)
    reader = DiskKeeper(tmp_path / "store")
    keys = [k(i) for i in range(20)]
    got = dict(zip(keys, reader.get_many(keys)))
    expected = dict(rows(0, 20))
    bad = [key for key in keys if got[key] is None]
    assert len(bad) == 1 and all(got[key] == expected[key] for key in keys if key not in bad)
    assert per_entry == [10]  # only the damaged pack was verified entry by entry


def test_a_version_1_pack_is_still_read(tmp_path: Path) -> None:
    from blake3 import blake3

    items = rows(0, 3)
    offset = packs.HEAD_V1.size + len(items) * packs.SLOT.size
    index, data = [], []
    for key, payload in items:
        index.append(packs.SLOT.pack(bytes.fromhex(key), offset, len(payload)))
        data += [blake3(payload).digest(), payload]
        offset += packs.CHECK + len(payload)
    body = b"".join(index)
    check = blake3(struct.pack(">BI", 0, len(items)) + body).digest()
    head = packs.HEAD_V1.pack(packs.MAGIC_V1, 0, len(items), check)
    DiskKeeper(tmp_path / "store")  # the layout
    (tmp_path / "store" / "packs" / ("a" * 40 + ".pack")).write_bytes(head + body + b"".join(data))
    reader = DiskKeeper(tmp_path / "store")
    assert reader.get_many([key for key, _ in items]) == [v for _, v in items]
    assert reader.verify() == []


def test_threads_sharing_a_handle_read_right_values(tmp_path: Path) -> None:
    import threading

    keeper = DiskKeeper(tmp_path / "store")
    expected = dict(rows(0, 400))
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for b in range(10):
                batch = rows(t * 100 + b * 10, 10)
                keeper.put_many(batch)
                keys = [k(i) for i in range(0, 400, 7)]
                for key, got in zip(keys, keeper.get_many(keys)):
                    assert got is None or got == expected[key]
                keeper.discard(k(t * 100 + b))  # drops its packs from the cache meanwhile
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    fresh = DiskKeeper(tmp_path / "store")
    for key, got in zip(expected, fresh.get_many(list(expected))):
        assert got is None or got == expected[key]
