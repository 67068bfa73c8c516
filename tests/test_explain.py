"""``g.explain``'s records under a DiskKeeper's ``notes/``: damage is absence, never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from somatize import DiskKeeper, Done, Graph, Node


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
