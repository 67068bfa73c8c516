"""Keepers: where cached outputs live, as encoded bytes under content keys.

A keeper stores bytes, never live objects, so nothing another node does can
change a remembered value. Two stock keepers:

* ``MemoryKeeper(max_bytes)`` — in this process, least-recently-used entries evicted (or,
  ``policy="epochs"``, kept while they are still read)
  (O(1) a get or put; evictions counted in ``stats()``).
* ``DiskKeeper(path)`` — a content store shared by processes: single entries as one
  file each, batches (``put_many``) packed many to a file with an index; atomic
  writes, a checksum verified on every read (a corrupt entry is a miss, never
  returned), ``stats()``, ``verify()``, ``gc(max_bytes)`` that keeps pinned entries.
* ``TieredKeeper(fast, slow)`` — a MemoryKeeper in front of a DiskKeeper: reads at
  memory speed in this process, writes on disk and shared.

The files: ``protocol`` (the ``Keeper`` shape, ``KeeperStats``), ``atomic`` (atomic
writes, also used by checkpoints), ``memory_keeper``, ``disk_keeper`` with its
``loose`` entries and ``packs`` (``upkeep``: rewriting, verifying, gc), ``locks`` (the
lock files users of a store share), ``pins``, ``tiered``.
"""

from __future__ import annotations

from .atomic import atomic_file, atomic_write, fsync_dir
from .disk_keeper import DiskKeeper
from .memory_keeper import MemoryKeeper
from .protocol import Keeper, KeeperStats
from .tiered import TieredKeeper

__all__ = [
    "DiskKeeper",
    "Keeper",
    "KeeperStats",
    "MemoryKeeper",
    "TieredKeeper",
    "atomic_file",
    "atomic_write",
    "fsync_dir",
]
