"""Keepers: bytes under content keys, in memory (LRU by bytes) and on disk (a content store)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from somatize import DiskKeeper, Keeper, MemoryKeeper
from somatize.errors import KeeperError
from somatize.keepers import loose


def k(i: int) -> str:
    return f"{i:064x}"


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

        def stat(self, follow_symlinks: bool = True) -> os.stat_result:
            raise FileNotFoundError(self.path)

    def scan(root: str):  # type: ignore[no-untyped-def]
        yield from real_scan(root)
        yield Ghost()

    monkeypatch.setattr(loose, "scan", scan)
    assert keeper.stats().entries == 1
    assert keeper.gc(1 << 30) == 0
    assert keeper.gc(0) > 0 and keeper.stats().entries == 0


# -- several processes --------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import random, sys
    from somatize import DiskKeeper

    path, seed, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    keeper = DiskKeeper(path)
    rnd = random.Random(seed)

    def content(i):
        return (b"entry %d;" % i) * (200 + 50 * i)

    keys = ["%064x" % i for i in range(30)]
    wrong = 0
    if role == "tend":  # gc (keeping everything) and stats while the others write
        for _ in range(150):
            keeper.gc(1 << 40)
            keeper.stats()
            keeper.verify()
    elif role == "shrink":  # gc that removes and rewrites packs while others read them
        for n in range(60):
            keeper.pin("%064x" % (20 + n % 60))  # pinned one by one: gc rewrites its pack
            keeper.gc(20_000)
    elif role == "batch":  # packs of per-example entries, 20..79 (20..29 also loose)
        many = ["%064x" % i for i in range(20, 80)]
        for _ in range(20):
            rows = rnd.sample(range(20, 80), 6)
            keeper.put_many([("%064x" % i, content(i)) for i in rows])
            asked = rnd.sample(range(80), 10)
            for i, got in zip(asked, keeper.get_many(["%064x" % i for i in asked])):
                if got is not None and got != content(i):
                    wrong += 1
        keeper.put_many([(key, content(int(key, 16))) for key in many])  # all of them, at last
    else:
        order = list(range(30))
        for _ in range(3):
            rnd.shuffle(order)
            for i in order:
                keeper.put(keys[i], content(i))
                keeper.name("n%d" % (i % 4), keys[i])
                j = rnd.randrange(30)
                got = keeper.get(keys[j])
                if got is not None and got != content(j):
                    wrong += 1
    print(wrong)
    """
)


def content(i: int) -> bytes:
    return (b"entry %d;" % i) * (200 + 50 * i)


def run_roles(tmp_path: Path, env: dict[str, str], roles: list[str]) -> Path:
    """Run the WRITER script once per role, at once; each must see no wrong bytes."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    store = tmp_path / "store"
    DiskKeeper(store)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(store), str(seed), role],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed, role in enumerate(roles)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            outputs.append((p.returncode, out.strip(), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out, err in outputs:
        assert rc == 0, err
        assert out == "0"  # no reader ever saw wrong bytes
    return store


@pytest.mark.slow
def test_concurrent_writers_leave_a_consistent_store(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    store = run_roles(tmp_path, subprocess_env, ["write", "write", "batch", "batch", "tend"])
    keeper = DiskKeeper(store)
    assert keeper.verify() == []
    assert sorted(keeper.keys()) == [k(i) for i in range(80)]
    for i in range(80):
        assert keeper.get(k(i)) == content(i)
    assert keeper.get_many([k(i) for i in range(80)]) == [content(i) for i in range(80)]
    for name, key in keeper.names().items():
        assert keeper.lookup(name) == content(int(key, 16))
    assert not [f for f in store.rglob(".*.tmp")]  # every writer finished its renames


@pytest.mark.slow
def test_gc_removing_and_rewriting_packs_under_readers_never_serves_wrong_bytes(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    store = run_roles(tmp_path, subprocess_env, ["batch", "batch", "shrink", "shrink"])
    keeper = DiskKeeper(store)
    assert keeper.verify() == []
    got = keeper.get_many([k(i) for i in range(80)])
    assert all(g is None or g == content(i) for i, g in enumerate(got))
    assert keeper.stats().pinned > 0


KILLED = textwrap.dedent(
    """
    import os, sys
    from somatize import DiskKeeper

    path, mode, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    keeper = DiskKeeper(path)

    def content(i):
        return (b"%d:" % i) * (1 << 20)  # megabytes: a write takes a while

    if mode == "pause":  # stop inside the write, after the bytes, before the rename
        real_replace = os.replace

        def replace(src, dst):
            print("paused", flush=True)
            sys.stdin.readline()  # the parent kills us while we wait here
            real_replace(src, dst)

        os.replace = replace
    i = first
    while True:
        print("put", i, flush=True)
        keeper.put("%064x" % (i % 6), content(i % 6))
        i += 1
    """
)


def big_content(i: int) -> bytes:
    return (b"%d:" % i) * (1 << 20)


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_no_partial_entry(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    store = tmp_path / "store"
    keeper = DiskKeeper(store)
    rnd = random.Random(20240607)
    rounds = ["pause", "random", "pause", "random", "random", "random", "pause", "random"]
    for n, mode in enumerate(rounds):
        first = rnd.randrange(6)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(store), mode, str(first)],
            env=subprocess_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            if mode == "pause":
                assert proc.stdout.readline().split() == ["put", str(first)]
                before = set(keeper.keys())
                assert proc.stdout.readline().strip() == "paused"
            else:
                for _ in range(rnd.randint(1, 4)):  # kill somewhere in the next write
                    assert proc.stdout.readline().startswith("put")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdin:
                proc.stdin.close()
            if proc.stdout:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL, f"round {n}: the writer was not killed"
        if mode == "pause":
            # the bytes were written to a temp file that was never renamed: invisible
            assert set(keeper.keys()) == before
            assert list(store.rglob(f".{k(first)}.*.tmp"))
            if k(first) not in before:
                assert keeper.get(k(first)) is None
        for key in list(keeper.keys()):  # whatever is visible is complete and verified
            assert keeper.get(key) == big_content(int(key, 16)), f"round {n}: {key} is torn"
        assert keeper.verify() == []
    for tmp in store.rglob(".*.tmp"):  # leftovers of killed writers: gc takes them once old
        os.utime(tmp, (1_000_000, 1_000_000))
    keeper.gc(1 << 40)
    assert not list(store.rglob(".*.tmp"))
    assert all(keeper.get(key) is not None for key in list(keeper.keys()))
