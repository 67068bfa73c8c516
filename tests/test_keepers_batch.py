"""The batch API of both keepers (get_many, put_many, discard) and MemoryKeeper's budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from somatize import DiskKeeper, Keeper, MemoryKeeper
from somatize.errors import KeeperError
from somatize.keepers import KeeperStats
from somatize.keepers.memory_keeper import DEFAULT_MAX_BYTES


def k(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture(params=["memory", "disk"])
def keeper(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryKeeper | DiskKeeper:
    return MemoryKeeper() if request.param == "memory" else DiskKeeper(tmp_path / "store")


def test_get_many_answers_in_order_with_none_for_absent(keeper: MemoryKeeper | DiskKeeper) -> None:
    assert isinstance(keeper, Keeper)
    assert keeper.get_many([]) == []
    keeper.put_many([(k(i), b"row %d" % i) for i in range(10)])
    keeper.put(k(50), b"single")
    got = keeper.get_many([k(9), k(99), k(0), k(50), k(9)])
    assert got == [b"row 9", None, b"row 0", b"single", b"row 9"]
    assert [keeper.get(k(i)) for i in (3, 7)] == [b"row 3", b"row 7"]  # get sees a batch
    assert keeper.stats().entries == 11


def test_put_many_with_repeated_keys_keeps_the_last(keeper: MemoryKeeper | DiskKeeper) -> None:
    keeper.put_many([(k(1), b"first"), (k(2), b"two"), (k(1), b"last")])
    assert keeper.get_many([k(1), k(2)]) == [b"last", b"two"]
    assert keeper.stats().entries == 2


def test_put_many_checks_every_key_before_storing_any(
    keeper: MemoryKeeper | DiskKeeper,
) -> None:
    with pytest.raises(KeeperError, match="64 lowercase hex digits"):
        keeper.put_many([(k(1), b"ok"), ("nope", b"bad")])
    assert keeper.get(k(1)) is None and keeper.stats().entries == 0


def test_a_disk_keeper_refuses_a_key_that_is_not_a_digest(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many([(k(1), b"ok")])
    with pytest.raises(KeeperError, match="invalid key"):
        keeper.get_many([k(1), "../../etc/passwd"])  # never a path outside the store


def test_pinned_batches_survive_gc(keeper: MemoryKeeper | DiskKeeper) -> None:
    keeper.put_many([(k(i), bytes(50)) for i in range(4)], pinned=True)
    keeper.put_many([(k(i), bytes(50)) for i in range(4, 8)])
    keeper.gc(0)
    assert keeper.get_many([k(i) for i in range(8)]) == [bytes(50)] * 4 + [None] * 4
    assert keeper.stats().pinned == 4


def test_discard_forgets_one_entry(keeper: MemoryKeeper | DiskKeeper) -> None:
    keeper.put_many([(k(i), b"v%d" % i) for i in range(3)])
    keeper.put(k(9), b"loose")
    keeper.discard(k(1))
    keeper.discard(k(9))
    keeper.discard(k(42))  # absent: nothing to do
    assert keeper.get_many([k(0), k(1), k(2), k(9)]) == [b"v0", None, b"v2", None]
    assert keeper.stats().entries == 2
    keeper.put_many([(k(1), b"v1 again")])  # recomputed and stored afresh
    assert keeper.get(k(1)) == b"v1 again"


def test_a_discarded_packed_entry_is_gone_for_another_process_too(tmp_path: Path) -> None:
    one, two = DiskKeeper(tmp_path / "store"), DiskKeeper(tmp_path / "store")
    one.put_many([(k(i), b"v%d" % i) for i in range(3)])
    assert two.get(k(1)) == b"v1"
    one.discard(k(1))
    assert DiskKeeper(tmp_path / "store").get_many([k(0), k(1), k(2)]) == [b"v0", None, b"v2"]
    assert two.get_many([k(1), k(2)]) == [None, b"v2"]  # its index learns the pack was rewritten


# -- MemoryKeeper: O(1), bounded, evictions visible ----------------------------------------


def test_memory_keeper_has_a_default_budget_and_counts_evictions() -> None:
    assert MemoryKeeper().max_bytes == DEFAULT_MAX_BYTES == 1 << 30
    keeper = MemoryKeeper(max_bytes=100)
    keeper.put_many([(k(i), bytes(30)) for i in range(5)])  # 150 bytes: two must go
    stats = keeper.stats()
    assert (stats.entries, stats.bytes, stats.evicted, stats.evicted_bytes) == (3, 90, 2, 60)
    assert keeper.get_many([k(0), k(1), k(2)]) == [None, None, bytes(30)]
    assert "2 evicted (60 bytes)" in str(stats)


def test_memory_keeper_put_does_not_copy_its_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    # The old eviction copied the whole key list on every put (quadratic): count the
    # entries eviction looks at instead of timing it.
    keeper = MemoryKeeper(max_bytes=10 * 1000)
    looked = 0
    real = keeper._lru.popitem

    def popitem(last: bool = True) -> tuple[str, bytes]:
        nonlocal looked
        looked += 1
        return real(last)

    monkeypatch.setattr(keeper._lru, "popitem", popitem, raising=False)
    for i in range(3000):
        keeper.put(k(i), bytes(10))
    assert looked == 2000  # one pop per evicted entry, none for the entries kept
    assert keeper.stats().evicted == 2000 and len(keeper) == 1000


def test_memory_keeper_unpin_lets_an_entry_go() -> None:
    keeper = MemoryKeeper(max_bytes=20)
    keeper.put(k(0), bytes(10), pinned=True)
    keeper.put(k(1), bytes(10))
    keeper.put(k(2), bytes(10))  # over budget: k(1) goes, the pinned k(0) stays
    assert k(0) in keeper and k(1) not in keeper
    keeper.unpin(k(0))
    assert keeper.stats().pinned == 0
    keeper.gc(0)
    assert len(keeper) == 0


def test_keeper_stats_reads_as_before_when_nothing_was_evicted() -> None:
    assert str(KeeperStats(2, 20, 1, 0)) == "2 entries, 20 bytes, 1 pinned, 0 names"
    assert (
        str(KeeperStats(2, 20, 1, 0, packs=1)) == "2 entries, 20 bytes, 1 pinned, 0 names, 1 pack"
    )


def test_keeper_stats_count_one_in_the_singular() -> None:
    one = KeeperStats(1, 1, 1, 1, evicted=1, evicted_bytes=1, packs=1)
    assert str(one) == "1 entry, 1 byte, 1 pinned, 1 name, 1 pack, 1 evicted (1 byte)"
    many = KeeperStats(0, 2, 0, 2, evicted=2, evicted_bytes=0, packs=2)
    assert str(many) == "0 entries, 2 bytes, 0 pinned, 2 names, 2 packs, 2 evicted (0 bytes)"


def test_a_buffer_is_stored_as_its_bytes_and_never_as_the_callers_object(
    keeper: MemoryKeeper | DiskKeeper, tmp_path: Path
) -> None:
    """Found by an outside audit: a 2-D memoryview (its len() is not its byte count) was
    indexed by len() and read back wrong (or lost its neighbour), and a bytearray was
    kept in the read cache as the caller's object, so changing it changed the entry."""
    grid = memoryview(bytes(range(20))).cast("B", (4, 5))
    keeper.put_many([(k(1), grid), (k(2), b"hello-world")])
    keeper.put(k(3), memoryview(bytes(range(6))).cast("B", (2, 3)))
    mine = bytearray(b"original")
    keeper.put_many([(k(4), mine)])
    mine[:] = b"MUTATED!"
    want = [bytes(range(20)), b"hello-world", bytes(range(6)), b"original"]
    assert keeper.get_many([k(1), k(2), k(3), k(4)]) == want
    assert all(type(v) is bytes for v in keeper.get_many([k(1), k(4)]))
    if isinstance(keeper, DiskKeeper):  # from disk too, without the read cache
        fresh = DiskKeeper(tmp_path / "store", read_cache=0)
        assert fresh.get_many([k(1), k(2), k(3), k(4)]) == want
