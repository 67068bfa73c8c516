"""Building many objects at once, without the cyclic garbage collector's full scans.

Making a graph of 10,000 nodes or the ``nn.Module`` over it allocates hundreds of
thousands of objects that all survive. Each time enough of them accumulate, the collector
runs a *full* collection, which scans every object alive — the whole process, not only what
is being built — so construction costs grow faster than the graph. What is built here holds
no reference cycles to reclaim, so ``paused_gc`` holds back the full (oldest-generation)
collections until the build is done.

The young collections go on as usual: each scans the few hundred objects allocated last,
still in the CPU's cache. (Disabling the collector outright, as this once did, left one
young collection of *everything* built for the end, over memory long out of the cache: at
10,000 nodes, a third of the cost of ``module(g)``.) The previous thresholds come back
after the block, also on error; a collector the caller disabled is left alone. Only for
what runs outside a traced forward: ``torch.compile`` cannot trace ``gc``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]

_NEVER = 1 << 30  # a gen-2 threshold no build reaches


@contextmanager
def paused_gc() -> Iterator[None]:
    """Hold back full garbage collections for the block; young ones go on. Restores the
    collector's thresholds after."""
    if not gc.isenabled():
        yield
        return
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)
