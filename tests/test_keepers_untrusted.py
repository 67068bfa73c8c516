"""A cache directory given by someone else: links planted in it, crafted packs and entries.

Whatever such a store holds, somatize must not remove or create files outside it, nor
size a read or an allocation by a length it claims, nor print what its file names say.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest
from blake3 import blake3

from somatize import DiskKeeper
from somatize.cli import main
from somatize.errors import KeeperError
from somatize.keepers import packs

OLD = time.time() - 7200  # older than gc's hour for temp files


def k(i: int) -> str:
    return f"{i:064x}"


def victim(tmp_path: Path) -> Path:
    """A folder outside the store: a dotfile older than an hour, and a file named like an
    entry (a HuggingFace blob is a 64-hex-digit name too)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("precious")
    (home / k(0xEE)).write_text("a model's weights")
    for f in home.iterdir():
        os.utime(f, (OLD, OLD))
    return home


@pytest.mark.parametrize("call", ["gc", "verify"])
def test_gc_and_verify_never_remove_through_a_linked_folder(tmp_path: Path, call: str) -> None:
    """Found by an outside audit: a link planted at objects/ee (after this handle opened
    the store) made gc remove every dotfile over an hour old where it pointed, and gc and
    verify every file there named like an entry."""
    home = victim(tmp_path)
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"ours")
    os.symlink(home, tmp_path / "store" / "objects" / "ee")
    keeper.gc(0) if call == "gc" else keeper.verify()
    assert sorted(p.name for p in home.iterdir()) == [".bashrc", k(0xEE)]
    assert keeper.get(k(1)) == (None if call == "gc" else b"ours")


@pytest.mark.parametrize(
    ("folder", "create"),
    [(f, c) for f in ("objects", "packs", "names", "pins") for c in (True, False)]
    + [("objects/ee", False)],  # (listed by the tools that tend a store, create=False)
)
def test_a_store_with_a_linked_folder_is_refused_naming_the_link(
    tmp_path: Path, folder: str, create: bool
) -> None:
    home = victim(tmp_path)
    store = tmp_path / "store"
    DiskKeeper(store)
    link = store / folder
    if link.exists():
        os.rmdir(link)
    os.symlink(home, link)
    with pytest.raises(KeeperError, match=rf"{link} is a symbolic link \(to '{home}'\)"):
        DiskKeeper(store, create=create)
    assert sorted(p.name for p in home.iterdir()) == [".bashrc", k(0xEE)]


def test_cache_gc_and_verify_refuse_a_store_with_a_linked_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = victim(tmp_path)
    store = tmp_path / "store"
    DiskKeeper(store).put(k(1), b"ours")
    os.symlink(home, store / "objects" / "ee")
    for action in (["gc", "--max-bytes", "0"], ["verify"]):
        assert main(["cache", *action, "--dir", str(store)]) == 2
        assert "objects/ee is a symbolic link" in capsys.readouterr().err
    assert sorted(p.name for p in home.iterdir()) == [".bashrc", k(0xEE)]
    assert (store / "objects" / "00" / k(1)).is_file()  # nor anything of the store touched


def test_gc_removes_only_temp_files_of_its_own_naming(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"ours")
    folder = tmp_path / "store" / "objects" / "00"
    ours, other = folder / f".{k(2)}.123-0.tmp", folder / ".notes"
    for f in (ours, other):
        f.write_bytes(b"x")
        os.utime(f, (OLD, OLD))
    keeper.gc(1 << 30)
    assert not ours.exists() and other.exists()


def test_a_linked_lock_file_is_never_opened_through(tmp_path: Path) -> None:
    """Found by an outside audit: pins/.lock planted as a link made every pin create (or
    open for writing) the file it points to."""
    keeper = DiskKeeper(tmp_path / "store")
    target = tmp_path / "elsewhere" / "made-by-somatize"
    target.parent.mkdir()
    os.symlink(target, tmp_path / "store" / "pins" / ".lock")
    with pytest.warns(UserWarning, match=r"pins/\.lock .*Remove it: a lock file is never a link"):
        keeper.put(k(1), b"pinned", pinned=True)
    assert not target.exists()
    assert keeper.get(k(1)) == b"pinned"


def crafted_pack(store: Path, lengths: list[int]) -> list[str]:
    """A pack whose index verifies (its checksum is no secret) but claims ``lengths``."""
    n, keys = len(lengths), [k(i + 1) for i in range(len(lengths))]
    offset = packs.HEAD.size + n * packs.SLOT.size
    index, data = [], []
    for key, length in zip(keys, lengths):
        index.append(packs.SLOT.pack(bytes.fromhex(key), offset, length))
        data.append(blake3(b"ab").digest() + b"ab")
        offset += packs.CHECK + 2
    section, raw = b"".join(data), b"".join(index)
    check = blake3(packs._COUNTS.pack(0, n) + blake3(section).digest() + raw).digest()
    head = packs.HEAD.pack(packs.MAGIC, 0, n, check, blake3(section).digest())
    (store / "packs" / ("c" * 40 + ".pack")).write_bytes(head + raw + section)
    return keys


@pytest.mark.parametrize("call", ["get_many", "verify", "gc"])
def test_a_pack_claiming_a_huge_entry_is_a_miss_not_a_memory_error(
    tmp_path: Path, call: str
) -> None:
    """Found by an outside audit: a slot claiming 2**62 bytes sized the read of its
    batch's span: ``MemoryError`` from get_many, verify and gc."""
    DiskKeeper(tmp_path / "store")
    keys = crafted_pack(tmp_path / "store", [2, 1 << 62])
    keeper = DiskKeeper(tmp_path / "store", read_cache=0)  # (a span read, not the whole pack)
    if call == "get_many":
        assert keeper.get_many(keys) == [b"ab", None]
    elif call == "verify":
        assert keeper.verify() == [keys[1]]
    else:
        keeper.gc(0)
    assert keeper.get(keys[1]) is None


def test_a_large_file_that_is_no_entry_is_not_read_into_memory(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    path = tmp_path / "store" / "objects" / "00" / k(1)
    path.parent.mkdir()
    with open(path, "wb") as f:  # sparse: 256 MiB on no disk
        f.write(b"not an entry header, but long enough to be read as one...")
        f.truncate(256 << 20)
    tracemalloc.start()
    try:
        assert keeper.get(k(1)) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert not path.exists()  # (a corrupt entry goes, as before)


def test_names_and_packs_that_are_not_ours_are_neither_listed_nor_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an outside audit: a file in names/ is printed by `cache ls` as it is named
    (an escape sequence in a name is obeyed by the terminal), and verify removed and
    printed any damaged file ending in .pack."""
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"ours")
    keeper.name("mine", k(1))
    (tmp_path / "store" / "names" / "x\x1b]0;owned\x07").write_text(k(1))
    (tmp_path / "store" / "names" / "notakey").write_text("~/.ssh/id_rsa holds this")
    foreign = tmp_path / "store" / "packs" / "\x1b[2Jnotes.pack"
    foreign.write_bytes(b"a user's file")
    assert DiskKeeper(tmp_path / "store").names() == {"mine": k(1)}
    assert main(["cache", "ls", "--dir", str(tmp_path / "store")]) == 0
    assert main(["cache", "verify", "--dir", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and f"{k(1)}" in out and "mine" in out
    assert foreign.exists()
