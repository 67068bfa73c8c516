"""``g.explain``'s records under a DiskKeeper's ``notes/``: damage is absence, never a crash
(a FIFO, a link or an oversized file in a note's place included); a cached mapped node is
explained item by item."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from blake3 import blake3

from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node, explain, values


class Embed(Node):
    def __init__(self, dim: int) -> None:
        self.dim = dim

    def forward(self, word: Any, ctx: Any) -> Done:
        return Done([len(word) / (i + 1) for i in range(self.dim)])


def _graph(root: Path, dim: int) -> Graph:
    return Graph.somatize(Embed(dim), keeper=DiskKeeper(root)).cache("embed")


@pytest.mark.parametrize("damage", ["cut1", "cut3", "half", "flip"])
def test_a_damaged_note_is_read_as_absent(tmp_path: Path, damage: str) -> None:
    _graph(tmp_path, 4).forward("hello")
    intact = _graph(tmp_path, 5).explain("hello")["embed"]
    assert not intact.hit and any("declaration" in c for c in intact.changed)
    (note,) = list((tmp_path / "notes").iterdir())
    data = bytearray(note.read_bytes())
    if damage == "flip":
        data[-1] ^= 0x01
    else:
        data = data[: {"cut1": 1, "cut3": 3, "half": len(data) // 2}[damage]]
    note.write_bytes(bytes(data))
    why = _graph(tmp_path, 5).explain("hello")["embed"]
    assert not why.hit
    assert not any("declaration" in c for c in why.changed)  # the note says nothing now


class Counting(Node):
    """Counts its own calls: its state changes every time it runs."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, x: Any, ctx: Any) -> Done:
        self.calls += 1
        return Done(x + 1)


def test_a_cached_node_that_changes_itself_warns_and_explain_says_state() -> None:
    g = Graph.somatize(Counting(), keeper=MemoryKeeper()).cache("counting")
    with pytest.warns(UserWarning, match=r"node 'counting' \(Counting\) is cached but changed"):
        g.forward(1)
    g.forward(1)  # (warned once per node)
    why = g.explain(1)["counting"]
    assert not why.hit and why.changed == ("state (weights or held data)",)


COUNT = """
from somatize import Done, Node
FACTOR = {factor}
def weigh(n):
    return n * FACTOR
class Count(Node):
    def forward(self, words, ctx):
        return Done(weigh(len(words)))
"""


def test_explain_names_a_global_whose_value_changed(
    user_module: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    mod = user_module("explain_globals", COUNT.format(factor=2))
    Graph.somatize(mod.Count(), keeper=DiskKeeper(tmp_path)).cache("count").forward(["a"])
    mod = user_module("explain_globals", COUNT.format(factor=3))
    g = Graph.somatize(mod.Count(), keeper=DiskKeeper(tmp_path)).cache("count")
    why = g.explain(["a"])["count"]
    assert not why.hit and why.changed == ("global FACTOR (read by explain_globals.weigh)",)


class Halve(Node):
    def forward(self, x, ctx):
        return Done(x / 2)


def test_the_record_a_miss_leaves_reads_the_nodes_code_once_per_identity(monkeypatch):
    # every miss walked the node's code and helpers again for its record (with realpath's
    # lstat calls per module): most of a miss's cost
    import somatize.changes as changes

    walks = []
    real = changes._reached
    monkeypatch.setattr(changes, "_reached", lambda obj: walks.append(obj) or real(obj))
    g = Graph(keeper=MemoryKeeper()).node("h", Halve()).cache("h")
    assert [g.forward(float(i)) for i in range(10)] == [i / 2 for i in range(10)]  # 10 misses
    assert len(walks) == 2  # its code, and its globals: once


def test_explain_reports_a_cached_mapped_node_item_by_item(tmp_path: Path) -> None:
    # before: g.explain returned nothing at all for a cached mapped node
    def graph(dim: int) -> Graph:
        return (
            Graph(keeper=DiskKeeper(tmp_path / "c"))
            .node("embed", Embed(dim).mapped())
            .cache("embed")
        )

    g = graph(2)
    (first,) = g.explain(["a", "bb"])
    assert not first.hit and first.rows == (0, 2) and first.unit == "items"
    assert first.changed == ("nothing stored under this node yet",)
    g.forward(["a", "bb"])
    assert str(g.explain(["a", "bb"])) == "embed: hit (2 of 2 items hit)"
    assert str(g.explain(["a", "ccc"])) == (
        "embed: miss (1 of 2 items hit) — input: 1 item not seen before"
    )
    # another process, another constructor argument: the record says what changed
    assert "declaration (constructor arguments)" in graph(3).explain(["a"])["embed"].changed


def _said_declaration(root: Path) -> bool:
    """Whether the note under ``root`` (left by dim 4) is read: dim 5 then names the change."""
    return any("declaration" in c for c in _graph(root, 5).explain("hello")["embed"].changed)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_place_of_a_note_is_no_note_and_no_hang(tmp_path: Path) -> None:
    # a plain open of a FIFO waits for a writer: g.explain hung
    _graph(tmp_path, 4).forward("hello")
    (note,) = list((tmp_path / "notes").iterdir())
    note.unlink()
    os.mkfifo(note)
    found: list[bool] = []
    thread = threading.Thread(target=lambda: found.append(_said_declaration(tmp_path)), daemon=True)
    thread.start()
    thread.join(timeout=30)  # (a guard against a hang, not a timing: the read takes ms)
    hung = thread.is_alive()
    if hung:  # release the blocked reader (it then reads an empty note) before failing
        os.close(os.open(note, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=30)
    assert not hung and found == [False]
    assert note.is_fifo()  # (explain removes nothing)


@pytest.mark.parametrize("over", [False, True])
def test_a_note_over_the_bound_is_no_note(
    tmp_path: Path, over: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _graph(tmp_path, 4).forward("hello")
    (note,) = list((tmp_path / "notes").iterdir())
    raw = note.read_bytes()
    record = values.decode(raw[explain._SUM :])
    # the same record, checksummed, made larger than the bound (or just under it)
    data = values.encode({**record, "padding": "x" * explain.NOTE_BYTES})
    note.write_bytes(blake3(data).digest(explain._SUM) + data)
    size = note.stat().st_size
    monkeypatch.setattr(explain, "NOTE_BYTES", size - 1 if over else size)
    assert _said_declaration(tmp_path) is not over


def test_a_note_that_is_a_symlink_is_not_read_through(tmp_path: Path) -> None:
    _graph(tmp_path / "c", 4).forward("hello")
    assert _said_declaration(tmp_path / "c")  # the note as written is read
    (note,) = list((tmp_path / "c" / "notes").iterdir())
    outside = tmp_path / "outside"
    note.rename(outside)  # a valid note, planted elsewhere and linked in
    note.symlink_to(outside)
    planted = outside.read_bytes()
    assert not _said_declaration(tmp_path / "c")
    assert note.is_symlink() and outside.read_bytes() == planted  # neither touched
