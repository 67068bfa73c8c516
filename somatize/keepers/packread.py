"""Reading a DiskKeeper's packs: a span of entries at a time, or whole through the read
cache (``somatize.keepers.readcache``) while every pack fits in it."""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Sequence

from blake3 import blake3

from ..errors import KeeperError
from . import loose, packs
from .packs import CHECK, NotRegular, Pack, PackIndex, entries, read_exact
from .protocol import fail
from .readcache import PackCache
from .upkeep import rewrite

__all__ = ["every_entry", "read_packed"]


def read_packed(
    index: PackIndex, cache: PackCache, root: str, keys: Sequence[str], retry: bool = True
) -> list[bytes | None]:
    """Entries found in packs (None elsewhere): one open and one read per pack."""
    rows = cache.rows
    if rows:  # entries of packs read whole, already verified
        out: list[bytes | None] = [rows.get(k) for k in keys]
        cache.touch(index.path, loose.TOUCH_AFTER)
        if None not in out:
            return out
    else:
        out = [None] * len(keys)
    where = index.where
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)  # pack -> (i, slot)
    for i, key in enumerate(keys):
        if out[i] is None:
            loc = where.get(key)
            if loc is not None:
                groups[loc[0].name].append((i, loc[1]))
    vanished: list[int] = []
    # read packs whole while all of them fit in the read cache (a store bigger than it
    # is read a span at a time: never a whole pack for one row)
    whole = 0 < index.bytes <= cache.max_bytes
    for name, wanted in groups.items():
        pack = index.packs.get(name)
        if pack is None:
            continue
        corrupt = []
        with index.lock:
            try:
                held = index.opened(name)
            except FileNotFoundError:  # removed or rewritten by another process's gc
                vanished.extend(i for i, _ in wanted)
                continue
            except NotRegular:
                index.drop([name])
                continue
            fd, st, touched = held
            try:
                if whole:  # every entry read and verified; kept if none is corrupt
                    every = every_entry(fd, st.st_size, pack)
                    got = [every[s] for _, s in wanted]
                    if None not in every:
                        cache.add(name, pack.keys, every)  # type: ignore[arg-type]
                else:
                    got = entries(fd, st.st_size, [pack.slots[s] for _, s in wanted])
                for (i, s), payload in zip(wanted, got):
                    out[i] = payload
                    if payload is None:
                        corrupt.append(pack.keys[s])
                now = time.time()
                if touched < now - loose.TOUCH_AFTER:
                    held[2] = now
                    with contextlib.suppress(OSError):
                        os.utime(fd)  # recency, for gc
            except OSError as e:
                raise fail("read cache pack", index.path(name), e) from e
        if corrupt:  # recomputed and written afresh; a read-only disk keeps the pack
            with contextlib.suppress(KeeperError):
                rewrite(index, root, name, drop=set(corrupt))
    if vanished and retry:
        index.refresh(force=True)
        again = read_packed(index, cache, root, [keys[i] for i in vanished], retry=False)
        for i, found in zip(vanished, again, strict=True):
            out[i] = found
    return out


def every_entry(fd: int, size: int, pack: Pack) -> list[bytes | None]:
    """Every entry of ``pack``, in slot order, verified; None where one is corrupt.

    A version-2 pack whose data section matches its checksum is verified by that one
    blake3 call; otherwise each entry by its own checksum (``entries``).
    """
    slots = pack.slots
    if pack.data_check is not None and slots:
        lo = slots[0][0]
        whole = read_exact(fd, size - lo, lo)
        if blake3(whole).digest() == pack.data_check:
            view = memoryview(whole)
            out: list[bytes | None] = []
            for off, n in slots:
                start = off - lo + CHECK
                out.append(bytes(view[start : start + n]))
            return out
    return packs.entries(fd, size, slots)  # each entry by its own checksum
