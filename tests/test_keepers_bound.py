"""``DiskKeeper(path, max_bytes=N)``: a store that its writers keep near ``N`` bytes by
themselves, removing the least recently used unpinned entries as ``gc(N)`` does."""

from __future__ import annotations

import pickle

import pytest

from somatize import DiskKeeper


def batch(start: int, n: int = 10, size: int = 1000) -> list[tuple[str, bytes]]:
    """``n`` entries of ``size`` bytes each (keys ``start``, ``start + 1``, ...)."""
    return [(f"{i:064x}", bytes([i % 256]) * size) for i in range(start, start + n)]


def test_a_bounded_store_stays_near_its_bound_and_keeps_the_latest_entries(tmp_path):
    bound = 40_000
    keeper = DiskKeeper(tmp_path, max_bytes=bound)
    for b in range(30):  # 300,000 bytes written in all: 7.5 times the bound
        keeper.put_many(batch(10 * b))
    # checked every eighth of the bound written: over it by at most that and one batch
    assert keeper.stats().bytes <= bound + bound // 8 + 11_000
    latest = batch(290)
    assert keeper.get_many([k for k, _ in latest]) == [v for _, v in latest]
    assert DiskKeeper(tmp_path).get_many([batch(0)[0][0]]) == [None]  # the oldest went


def test_loose_entries_count_and_pinned_ones_stay(tmp_path):
    keeper = DiskKeeper(tmp_path, max_bytes=20_000)
    (key, data), *_ = batch(10_000, n=1)
    keeper.put(key, data, pinned=True)
    for i in range(100):
        keeper.put(*batch(i, n=1)[0])
    assert keeper.stats().bytes <= 20_000 + 2_500 + 1_100
    assert keeper.get(key) == data


def test_an_unbounded_handle_removes_nothing(tmp_path):
    DiskKeeper(tmp_path, max_bytes=50_000).put_many(batch(0, n=40))
    keeper = DiskKeeper(tmp_path)
    for b in range(1, 10):
        keeper.put_many(batch(100 * b, n=40))
    assert keeper.stats().entries == 400


def test_the_bound_travels_with_the_keeper_to_a_worker(tmp_path):
    copy = pickle.loads(pickle.dumps(DiskKeeper(tmp_path, max_bytes=30_000, read_cache=0)))
    for b in range(20):
        copy.put_many(batch(10 * b))
    assert copy.stats().bytes <= 30_000 + 30_000 // 8 + 11_000


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1G"])
def test_a_bound_that_is_not_a_positive_int_is_refused_naming_it(tmp_path, bad):
    with pytest.raises(ValueError, match=r"DiskKeeper\(max_bytes=.*an int of 1 or more"):
        DiskKeeper(tmp_path, max_bytes=bad)


def test_stats_count_what_the_bound_removed_loose_and_packed(tmp_path):
    keeper = DiskKeeper(tmp_path, max_bytes=20_000)
    assert (keeper.stats().evicted, keeper.stats().evicted_bytes) == (0, 0)
    for i in range(60):  # loose entries, one at a time
        keeper.put(*batch(i, n=1)[0])
    for b in range(10):  # packs of ten
        keeper.put_many(batch(1000 + 10 * b))
    stats = keeper.stats()
    written = 60 + 100
    assert stats.evicted == written - stats.entries  # every entry gone was the bound's
    assert stats.evicted_bytes >= stats.evicted * 1000  # (each entry's payload at least)
    # counted per handle: one opened on the same store has removed nothing
    assert DiskKeeper(tmp_path).stats().evicted == 0
    keeper.gc(0)  # an explicit gc is what its caller asked for, not an eviction
    assert keeper.stats().evicted == stats.evicted
