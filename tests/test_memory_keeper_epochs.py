"""``MemoryKeeper(policy="epochs")``: a keeper smaller than an epoch keeps its share of a
shuffled epoch (least recently used eviction keeps the rows read last, which the next
epoch's misses evict before their turn), and still follows a key set that changes: a
sweep's next backbone (the keeper cold), or one node's rows replaced while another's are
read (the old ones stale)."""

from __future__ import annotations

import random

import pytest

from somatize import MemoryKeeper

ROW = b"x" * 100


def key(run: int, i: int) -> str:
    return f"{run:04d}{i:060d}"


def epochs(
    keeper: MemoryKeeper, keys: list[str], n: int, seed: int = 0, shuffle: bool = True
) -> list[float]:
    """Each epoch's share of rows found, reading ``keys`` shuffled in batches of 32, storing
    the misses (as a cached node does)."""
    rng, found = random.Random(seed), []
    for _ in range(n):
        order = list(keys)
        if shuffle:
            rng.shuffle(order)
        hits = 0
        for b in range(0, len(order), 32):
            batch = order[b : b + 32]
            got = keeper.get_many(batch)
            hits += sum(g is not None for g in got)
            keeper.put_many([(k, ROW) for k, g in zip(batch, got, strict=True) if g is None])
        found.append(hits / len(keys))
    return found


@pytest.mark.parametrize("share", [0.5, 0.1])
def test_a_keeper_below_an_epoch_finds_its_share_of_every_warm_epoch(share):
    rows = [key(0, i) for i in range(2000)]
    room = int(len(rows) * share) * len(ROW)
    lru = epochs(MemoryKeeper(max_bytes=room), rows, 5)
    kept = epochs(MemoryKeeper(max_bytes=room, policy="epochs"), rows, 5)
    assert lru[0] == kept[0] == 0.0
    assert all(f < 0.2 * 2 * share for f in lru[1:]), lru  # (0.15 at half, 0.01 at a tenth)
    assert all(f >= 0.95 * share for f in kept[2:]), kept
    assert kept[1] >= 0.6 * share, kept


def test_rows_read_in_the_same_order_every_epoch_are_found_as_shuffled_ones():
    """``shuffle=False`` (or a sweep's fits each replaying one order): least recently used
    evicts each row just before its turn and finds none; the policy keeps the first half."""
    rows = [key(0, i) for i in range(2000)]
    lru = epochs(MemoryKeeper(max_bytes=1000 * len(ROW)), rows, 4, shuffle=False)
    kept = epochs(MemoryKeeper(max_bytes=1000 * len(ROW), policy="epochs"), rows, 4, shuffle=False)
    assert lru == [0.0] * 4
    assert kept == [0.0, 0.5, 0.5, 0.5]


def test_a_new_key_set_is_taken_up_a_sweeps_next_backbone():
    """Nothing the keeper holds is read any more (all misses): past twice as many lookups as
    it holds entries it is cold, and the new keys replace the old as they come."""
    keeper = MemoryKeeper(max_bytes=1000 * len(ROW), policy="epochs")
    for run in range(3):
        found = epochs(keeper, [key(run, i) for i in range(2000)], 4, seed=run)
        assert found[0] == 0.0 and min(found[2:]) >= 0.45, (run, found)
    assert keeper.stats().entries == 1000


def test_rows_no_longer_read_go_stale_while_others_are_read():
    """Two nodes' rows, one node's replaced (its weights changed) while the other's are read
    every epoch: the keeper is never cold, so the old rows go once unread for 1.5 times the
    longest gap seen — without that they would hold their room for ever, and the new rows
    be refused (half of each epoch found, not all)."""
    keeper = MemoryKeeper(max_bytes=2400 * len(ROW), policy="epochs")
    fixed = [key(9, i) for i in range(1000)]
    epochs(keeper, fixed + [key(0, i) for i in range(1000)], 3)
    found = epochs(keeper, fixed + [key(1, i) for i in range(1000)], 6, seed=1)
    assert found[0] == pytest.approx(0.5)  # the fixed node's rows only
    assert found[-1] == 1.0, found
    assert keeper.stats().refused > 0


def test_what_is_kept_is_read_back_and_counted():
    keeper = MemoryKeeper(max_bytes=3 * len(ROW), policy="epochs")
    keys = [key(0, i) for i in range(5)]
    for k in keys:  # new: it keeps what comes first
        keeper.put(k, ROW)
    assert keeper.keys() == keys[:3] and keeper.stats().refused == 2
    assert keeper.get(keys[0]) == ROW  # read: the keeper is warm
    keeper.put(key(1, 0), ROW)  # nothing stale, nothing cold: not kept
    assert key(1, 0) not in keeper and keeper.stats().refused == 3
    for i in range(2, 67):  # 65 lookups, nothing found: cold (at least 64, twice its 3)
        assert keeper.get(key(2, i)) is None
    keeper.put(keys[4], ROW)  # kept, the least recently used evicted
    assert keeper.keys() == [keys[2], keys[0], keys[4]]
    assert keeper.get(keys[4]) == ROW  # warm again
    keeper.put(keys[0], b"new")  # a kept key's new value is always stored
    assert keeper.get(keys[0]) == b"new"
    # a pinned entry is stored too (never evicted), its room taken from the unpinned ones
    keeper.put(key(1, 1), ROW, pinned=True)
    assert keeper.get(key(1, 1)) == ROW
    assert keeper.keys() == [keys[4], keys[0], key(1, 1)]
    stats = keeper.stats()
    assert (stats.entries, stats.pinned, stats.evicted, stats.refused) == (3, 1, 2, 3)
    assert "2 evicted (200 bytes), 3 refused" in str(stats)
    assert repr(keeper) == "MemoryKeeper(max_bytes=300, policy='epochs')"
    keeper.gc(0)  # gc still empties it of unpinned entries
    assert keeper.keys() == [key(1, 1)]


def test_an_unknown_policy_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"policy='fifo'\): give 'lru' .* or 'epochs'"):
        MemoryKeeper(policy="fifo")  # type: ignore[arg-type]


def test_in_front_of_a_slower_keeper_it_serves_its_share():
    """A ``TieredKeeper``'s fast tier with the policy: the slow tier's rows handed back to it
    are refused while its own are read, so it keeps serving half of each warm epoch."""
    from somatize import TieredKeeper

    rows = [key(0, i) for i in range(2000)]
    found = {}
    for policy in ("lru", "epochs"):
        fast = MemoryKeeper(max_bytes=1000 * len(ROW), policy=policy)
        tiered = TieredKeeper(fast, MemoryKeeper())
        assert epochs(tiered, rows, 4)[1:] == [1.0, 1.0, 1.0]  # the slow tier has them all
        found[policy] = epochs(fast, rows, 1, seed=9)[0]  # what the fast tier holds now
    assert found["epochs"] == 0.5 and found["lru"] < 0.5, found
