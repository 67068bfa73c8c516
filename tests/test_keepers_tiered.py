"""TieredKeeper: a MemoryKeeper in front of a DiskKeeper."""

from __future__ import annotations

from pathlib import Path

import pytest

from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node, TieredKeeper


def k(i: int) -> str:
    return f"{i:064x}"


def test_reads_fill_the_fast_keeper_and_writes_reach_both(tmp_path: Path) -> None:
    disk = DiskKeeper(tmp_path / "cache")
    disk.put_many([(k(1), b"one"), (k(2), b"two")])
    fast = MemoryKeeper()
    tiered = TieredKeeper(fast, DiskKeeper(tmp_path / "cache"))
    assert tiered.get_many([k(1), k(3), k(2)]) == [b"one", None, b"two"]
    assert fast.get_many([k(1), k(2)]) == [b"one", b"two"]  # filled from the disk
    tiered.put_many([(k(4), b"four")])
    tiered.put(k(5), b"five", pinned=True)
    other = DiskKeeper(tmp_path / "cache")  # another handle (another process) sees them
    assert other.get_many([k(4), k(5)]) == [b"four", b"five"]
    assert fast.get(k(4)) == b"four" and tiered.get(k(5)) == b"five"
    assert tiered.stats().entries == other.stats().entries == 4
    assert tiered.stats().pinned == 1


def test_a_second_read_is_served_from_memory(tmp_path: Path) -> None:
    class SlowCount(DiskKeeper):
        reads = 0

        def get_many(self, keys):  # type: ignore[no-untyped-def]
            SlowCount.reads += 1
            return super().get_many(keys)

    tiered = TieredKeeper(MemoryKeeper(), SlowCount(tmp_path / "cache"))
    tiered.put_many([(k(1), b"one")])
    assert tiered.get_many([k(1)]) == [b"one"]
    assert tiered.get_many([k(1)]) == [b"one"]
    assert SlowCount.reads == 0  # written through: every read came from memory
    tiered.fast = MemoryKeeper()  # a fresh process: the disk serves, then memory
    assert tiered.get_many([k(1)]) == tiered.get_many([k(1)]) == [b"one"]
    assert SlowCount.reads == 1


def test_a_graph_names_and_explains_through_a_tiered_keeper(tmp_path: Path) -> None:
    class Upper(Node):
        def forward(self, text, ctx):  # type: ignore[no-untyped-def]
            return Done(text.upper())

    tiered = TieredKeeper(MemoryKeeper(), DiskKeeper(tmp_path / "cache"))
    g = Graph(keeper=tiered).node("up", Upper()).cache("up").name("up", "last")
    assert g.forward("hi") == "HI"
    assert DiskKeeper(tmp_path / "cache").names().keys() == {"last"}
    assert (tmp_path / "cache" / "notes").is_dir()  # explain's records beside the entries
    assert str(g.explain("hi")) == "up: hit"
    tiered.discard(g.run("hi").key)
    assert str(g.explain("hi")).startswith("up: miss")


def test_unpin_many_reaches_the_disk_keeper_at_once(tmp_path: Path) -> None:
    """g.pin(node, False) on a TieredKeeper: each pinned pack is rewritten once, as the
    DiskKeeper's own unpin_many does (before: once per key, leaving a pack per key)."""
    tiered = TieredKeeper(MemoryKeeper(), DiskKeeper(tmp_path / "cache", read_cache=0))
    rows = [(k(i), b"row %d" % i) for i in range(64)]
    for b in range(0, 64, 16):
        tiered.put_many(rows[b : b + 16], pinned=True)  # 4 pinned packs
    tiered.unpin_many(key for key, _ in rows)
    stats = DiskKeeper(tmp_path / "cache").stats()
    assert (stats.pinned, stats.packs, stats.entries) == (0, 4, 64)  # (before: 64 packs)
    assert tiered.get_many([key for key, _ in rows]) == [data for _, data in rows]


def test_a_tier_that_is_not_a_keeper_is_refused_when_made(tmp_path: Path) -> None:
    disk = DiskKeeper(tmp_path / "cache")
    with pytest.raises(TypeError, match=r"TieredKeeper\(fast=\.\.\.\): 42 \(int\) is not a keeper"):
        TieredKeeper(42, disk)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"TieredKeeper\(slow=None\): .*TieredKeeper\(MemoryKeeper\(\)"
    ):
        TieredKeeper(MemoryKeeper(), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"MemoryKeeper is the class, not a keeper"):
        TieredKeeper(MemoryKeeper, disk)  # type: ignore[arg-type]
