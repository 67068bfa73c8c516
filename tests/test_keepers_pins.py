"""Graph.pin(node, False) unpins that node's entries, and only that node's; a pin and a
gc under way take turns."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from somatize import Ctx, DiskKeeper, Done, Graph, MemoryKeeper, Node
from somatize.keepers import upkeep
from somatize.keepers.pins import PinLog


class Add(Node):
    def __init__(self, n: int) -> None:
        self.n = n

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + self.n)


@pytest.fixture(params=["memory", "disk"])
def keeper(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryKeeper | DiskKeeper:
    return MemoryKeeper() if request.param == "memory" else DiskKeeper(tmp_path / "store")


def test_unpinning_a_node_lets_gc_take_its_entries(keeper: MemoryKeeper | DiskKeeper) -> None:
    g = Graph(keeper=keeper).node("a", Add(1)).node("b", Add(2)).edge("a", "b")
    g.cache("a").cache("b").pin("a").pin("b")
    assert g.forward(1) == 4 and g.forward(10) == 13
    assert keeper.stats().pinned == 4
    g.pin("a", False)
    assert keeper.stats().pinned == 2  # b's two entries keep their pins
    keeper.gc(0)
    assert keeper.stats().entries == 2
    g.pin("b", False)
    keeper.gc(0)
    assert keeper.stats().entries == 0
    if isinstance(keeper, DiskKeeper):
        # the markers went too (.lock: what pin and gc take turns on)
        assert [p.name for p in (keeper.path / "pins").iterdir()] == [".lock"]


def test_unpinning_a_mapped_node_unpins_each_item(keeper: MemoryKeeper | DiskKeeper) -> None:
    g = Graph.somatize(Add(1).mapped().with_id("m"), keeper=keeper).cache("m").pin("m")
    assert g.forward([1, 2, 3]) == [2, 3, 4]
    assert keeper.stats().pinned == 3
    g.pin("m", False)
    keeper.gc(0)
    assert keeper.stats().entries == 0


def test_a_hit_of_an_entry_pinned_elsewhere_is_unpinned_too(tmp_path: Path) -> None:
    first = Graph(keeper=DiskKeeper(tmp_path / "s")).node("a", Add(1)).cache("a").pin("a")
    assert first.forward(1) == 2
    keeper = DiskKeeper(tmp_path / "s")  # another process: it only reads the entry
    again = Graph(keeper=keeper).node("a", Add(1)).cache("a").pin("a")
    assert again.forward(1) == 2
    again.pin("a", False)
    assert keeper.stats().pinned == 0


def test_the_pin_log_records_only_pinned_nodes() -> None:
    log = PinLog().watching({"a"})
    for node, key in [("a", "k1"), ("a[3]", "k2"), ("b", "k3")]:
        log.on_event(type("CacheHit", (), {"node": node, "key": key})())
    assert log.take("a") == {"k1", "k2"} and log.take("b") == set() and log.take("a") == set()


def test_pinning_a_node_pins_the_entries_it_finds_too(keeper: MemoryKeeper | DiskKeeper) -> None:
    """Found by an outside audit: only entries written while the node was pinned were
    pinned, so an entry stored by an earlier, unpinned run was taken by gc."""
    g = Graph(keeper=keeper).node("a", Add(1)).cache("a")
    assert g.forward(1) == 2  # stored unpinned
    g.pin("a")
    assert g.forward(1) == 2  # found: now pinned
    assert keeper.stats().pinned == 1
    keeper.gc(0)
    assert keeper.stats().entries == 1 and g.forward(1) == 2


def test_gc_counts_what_it_frees_when_two_packs_hold_one_pinned_key(tmp_path: Path) -> None:
    """Found by an outside audit: each pack kept its pinned key by a rewrite, both to the
    same pack, and gc counted that pack's bytes twice: it reported too little freed and
    so removed more than it had to."""
    keeper = DiskKeeper(tmp_path / "store")
    key = [f"{i:064x}" for i in range(10)]
    keeper.put_many([(key[1], bytes(1000)), (key[2], bytes(1000))])
    keeper.put_many([(key[1], bytes(1000)), (key[3], bytes(1000))])  # another process's batch
    keeper.pin(key[1])
    before = keeper.stats().bytes
    freed = keeper.gc(0)
    after = keeper.stats().bytes
    assert freed == before - after > 0
    assert keeper.get(key[1]) == bytes(1000) and keeper.stats().entries == 1


def test_a_pin_during_a_gc_waits_for_it_and_every_later_gc_keeps_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # before: gc read pins/ once, so a pin landing while it removed was not seen, and the
    # entry went although pin had returned
    keeper = DiskKeeper(tmp_path / "store")
    first, second = "1" * 64, "2" * 64
    keeper.put(first, b"a" * 100)
    keeper.put(second, b"b" * 100)
    removing, go = threading.Event(), threading.Event()
    real = upkeep._remove

    def remove(path: str) -> bool:  # gc has read pins/ and removes: hold it there
        removing.set()
        go.wait(30)
        return real(path)

    monkeypatch.setattr(upkeep, "_remove", remove)
    gc = threading.Thread(target=keeper.gc, args=(0,))
    gc.start()
    assert removing.wait(30)
    pinned = threading.Event()
    pin = threading.Thread(target=lambda: (keeper.pin(second), pinned.set()))
    pin.start()
    time.sleep(0.3)
    assert not pinned.is_set()  # it waits for the gc under way
    go.set()
    gc.join(30)
    pin.join(30)
    assert pinned.is_set() and keeper.stats().entries == 0  # that gc came first
    keeper.put(second, b"b" * 100)
    keeper.gc(0)
    assert keeper.get(second) == b"b" * 100  # the pin holds for every gc after it
