"""What a ``DiskKeeper`` holds, read from one listing of its directories: keys, sizes and
counts (a stat per loose entry, a stat per pack; no entry is opened)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from ..errors import KeeperError
from . import loose
from .packs import CHECK, SLOT, PackIndex
from .protocol import KeeperStats, is_key

__all__ = ["keys", "markers", "refuse_links", "sizes", "stats"]

# the folders of a store (the ones g.explain and the kept-aside write included)
LAYOUT = ("objects", "names", "pins", "packs", "quarantine", "notes")


def refuse_links(root: str, *, deep: bool) -> None:
    """Refuse a store one of whose folders is a symbolic link.

    A store's folders are its own: a link planted in a cache given by someone else would
    have entries written, read and removed wherever it points (gc and verify follow
    none: ``loose.scan``). The store's own directory may be a link (the user chose it).
    ``deep``: ``objects/ab`` too, one listing of ``objects/`` — for a tool tending the
    store, not at every opening (a large store's listing costs more than the rest of it:
    0.2 ms for 256 folders, on a local disk).

    Raises:
        KeeperError: naming the link and where it points.
    """
    found = [f"{root}/{sub}" for sub in LAYOUT if os.path.islink(f"{root}/{sub}")]
    if deep and not found:
        try:
            with os.scandir(f"{root}/objects") as it:
                found = [e.path for e in it if e.is_symlink()]
        except OSError:  # (absent, or not a folder: the reads say so)
            pass
    if found:
        link = found[0]
        try:
            target = f" (to {os.readlink(link)!r})"
        except OSError:  # (removed meanwhile)
            target = ""
        raise KeeperError(
            f"{link} is a symbolic link{target}, where the cache at "
            f"{root} keeps a folder of its own: somatize neither writes nor removes files "
            "through it. Replace the link with the folder it points to (or remove it), or "
            "link the cache's whole directory instead"
        )


def markers(root: str, sub: str) -> list[str]:
    """The names in ``root/sub`` (``names``, ``pins``), temp files excluded."""
    try:
        with os.scandir(f"{root}/{sub}") as it:
            return [e.name for e in it if not e.name.startswith(".")]
    except FileNotFoundError:
        return []


def keys(root: str, index: PackIndex) -> Iterator[str]:
    """The keys of every entry, sorted (temp files excluded)."""
    index.refresh(force=True)
    found = {e.name for e in loose.scan(root) if is_key(e.name) and _regular(e)}
    yield from sorted(found | index.where.keys())


def sizes(root: str, index: PackIndex) -> Iterator[tuple[str, int]]:
    """Every entry's key and the bytes it takes, sorted by key: a loose entry's file
    size, or a packed entry's payload with its checksum and index slot."""
    loose_sizes, _ = _sizes(root, index)
    packed = {}
    for pack in index.packs.values():
        for key, (_, n) in zip(pack.keys, pack.slots, strict=True):
            packed[key] = CHECK + SLOT.size + n
    packed.update(loose_sizes)
    yield from sorted(packed.items())


def _regular(e: os.DirEntry[str]) -> bool:
    """A regular file (from the listing's file type: no stat). A directory, FIFO or
    symlink where an entry should be is no entry: a read quarantines or removes it."""
    return e.is_file(follow_symlinks=False)


def _sizes(root: str, index: PackIndex) -> tuple[dict[str, int], int]:
    """Loose entries' sizes, and the bytes of every pack (one stat per file)."""
    found = {}
    for e in loose.scan(root):
        if len(e.name) == 64 and e.name[0] != "." and _regular(e):
            try:  # noqa: SIM105 -- suppress() would cost a µs an entry
                found[e.name] = e.stat().st_size
            except FileNotFoundError:  # removed meanwhile
                pass
    index.refresh(force=True)
    return found, sum(st.st_size for _, st in index.sizes())


def stats(root: str, index: PackIndex) -> KeeperStats:
    """Counts read from one listing: a stat per loose entry, a stat per pack."""
    found, pack_bytes = _sizes(root, index)
    held = found.keys() | index.where.keys()
    pins = set(markers(root, "pins"))
    pinned = {k for p in index.packs.values() if p.pinned for k in p.keys}
    return KeeperStats(
        entries=len(held),
        bytes=sum(found.values()) + pack_bytes,
        pinned=len((pins & held) | pinned),
        names=len(markers(root, "names")),
        packs=len(index.packs),
    )
