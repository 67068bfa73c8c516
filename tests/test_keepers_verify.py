"""What ``verify`` reports: the entries lost, not the files removed — a pack whose index
is damaged goes whole, with every entry it held."""

from __future__ import annotations

from pathlib import Path

import pytest

from somatize import DiskKeeper
from somatize.cli import main
from somatize.keepers import packs
from tests.keeper_keys import k


def damaged(root: Path, where: str) -> str:
    """A store of one pack of 10 entries, damaged at ``where``, and one loose entry."""
    keeper = DiskKeeper(root)
    keeper.put_many([(k(i), b"row %d" % i) for i in range(10)])
    keeper.put(k(99), b"loose")
    (pack,) = (root / "packs").iterdir()
    raw = bytearray(pack.read_bytes())
    at = {
        "index": packs.HEAD.size + 3 * packs.SLOT.size + 40,  # inside the 4th slot
        "header": 0,  # the magic: the header says nothing, the first offset does
        "count": len(packs.MAGIC) + 4,  # the count itself: the first offset says it
    }[where]
    raw[at] ^= 0x10
    pack.write_bytes(bytes(raw))
    return f"packs/{pack.name}"


@pytest.mark.parametrize("where", ["index", "header", "count"])
def test_a_pack_with_a_damaged_index_counts_every_entry_it_held(tmp_path: Path, where: str):
    name = damaged(tmp_path, where)
    bad = DiskKeeper(tmp_path).verify()
    assert bad == [name] and bad.packs == {name: 10}
    assert bad.entries == 10 and bad.uncounted == 0  # (before: reported as 1)
    assert DiskKeeper(tmp_path).stats().entries == 1


def test_a_pack_whose_header_and_first_slot_say_nothing_counts_as_at_least_one(tmp_path):
    name = damaged(tmp_path, "header")
    path = tmp_path / name
    raw = bytearray(path.read_bytes())
    raw[packs.HEAD.size + 33] ^= 0x10  # the first entry's offset too
    path.write_bytes(bytes(raw))
    bad = DiskKeeper(tmp_path).verify()
    assert bad.packs == {name: None} and (bad.entries, bad.uncounted) == (1, 1)


def test_cache_verify_says_how_many_entries_a_damaged_pack_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = damaged(tmp_path, "index")
    assert main(["cache", "verify", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"removed {name}, a pack whose index is damaged, with its 10 entries" in out
    assert "\n10 corrupt entries removed;" in out  # (before: "1 corrupt entries removed")
    DiskKeeper(tmp_path).put(k(98), b"\x00 torn")
    (loose,) = [p for p in (tmp_path / "objects").rglob("*") if p.name == k(98)]
    loose.write_bytes(loose.read_bytes()[:-2])
    assert main(["cache", "verify", "--dir", str(tmp_path)]) == 1
    assert "\n1 corrupt entry removed;" in capsys.readouterr().out  # (not "1 ... entries")
