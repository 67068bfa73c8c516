"""``DiskKeeper.verify``: every entry checked, the bad removed, and what that cost counted.

A loose entry that fails is one entry lost. A pack is checked entry by entry and
rewritten without its bad entries — each one entry lost — but a pack whose index is
damaged cannot be read at all: it is removed whole, with every entry it held. Its
header says how many (``count``), or, where the header is the damaged part, the offset
of its first entry does (the index ends where the entries begin); so ``Removed.entries``
counts the entries lost, not the files.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..platforms import pread
from . import loose
from .packs import CHECK, HEAD, HEAD_V1, MAGIC, MAGIC_V1, SLOT, NotRegular, PackIndex, open_regular
from .protocol import is_key
from .upkeep import decodes, remove_bad, rewrite

__all__ = ["Removed", "held", "verify"]


class Removed(list[str]):
    """What ``verify`` removed, as a list: keys, and ``packs/<name>`` for a pack whose index
    was damaged. ``packs``: for each such pack, the entries it held (None where not even
    its header tells, or it was no file: a folder, a FIFO moved to ``quarantine/``)."""

    def __init__(self) -> None:
        super().__init__()
        self.packs: dict[str, int | None] = {}

    @property
    def entries(self) -> int:
        """The entries lost: one a key, a damaged pack's count (1 where unknown)."""
        return sum(1 if key not in self.packs else (self.packs[key] or 1) for key in self)

    @property
    def uncounted(self) -> int:
        """Damaged packs whose entries could not be counted (``entries`` counts each as 1)."""
        return sum(n is None for n in self.packs.values())


def held(path: str) -> int | None:
    """How many entries the pack at ``path`` holds, read from its header — or, where the
    header is damaged, from where its index ends (the first entry's offset); None where
    neither makes sense (or ``path`` is no regular file)."""
    try:
        fd, st = open_regular(path)
    except (OSError, NotRegular):
        return None
    try:
        head = pread(fd, HEAD.size + SLOT.size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)

    def fits(n: int, start: int) -> bool:  # an index of n slots and n checksums at least
        return n >= 1 and start + n * (SLOT.size + CHECK) <= st.st_size

    v1 = head[: len(MAGIC_V1)] == MAGIC_V1
    start = HEAD_V1.size if v1 else HEAD.size
    if (v1 or head[: len(MAGIC)] == MAGIC) and len(head) >= start:
        n = int.from_bytes(head[len(MAGIC) + 1 : len(MAGIC) + 5], "big")
        if fits(n, start):
            return n
    for start in (HEAD.size, HEAD_V1.size):  # the first slot's (key, offset, length)
        if len(head) >= start + SLOT.size:
            offset: int = SLOT.unpack_from(head, start)[1]
            n, extra = divmod(offset - start, SLOT.size)
            if not extra and fits(n, start):
                return n
    return None


def verify(root: str, index: PackIndex, decode: Callable[[bytes], object] | None) -> Removed:
    """``DiskKeeper.verify``: every loose entry, then every pack; the bad removed."""
    bad = Removed()
    for e in list(loose.scan(root)):
        if not is_key(e.name):
            continue
        try:
            payload, inode = loose.read(e.path)
        except loose.Hostile as h:
            loose.quarantine(root, e.path, h.inode)
            bad.append(e.name)
            continue
        if (payload is None and inode) or (
            payload is not None and decode is not None and not decodes(decode, payload)
        ):
            bad.append(e.name)
            loose.remove_if_same(e.path, inode)
    index.refresh(force=True)
    counts = {f"packs/{n}": held(index.path(n)) if r else None for n, (_, r) in index.bad.items()}
    for gone in remove_bad(index, root):
        bad.append(gone)
        bad.packs[gone] = counts.get(gone)
    for name, pack in list(index.packs.items()):
        found = rewrite(index, root, name, decode=decode)[0]
        bad += found
        if found == [f"packs/{name}"]:  # unreadable now: all its entries went
            bad.packs[found[0]] = len(pack.keys)
    return bad
