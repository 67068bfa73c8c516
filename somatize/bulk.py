"""Building many objects at once, with the cyclic garbage collector paused.

Making a graph of 10,000 nodes or the ``nn.Module`` over it allocates hundreds
of thousands of objects that all survive; each time enough of them accumulate, the
collector scans every object alive, so construction costs grow faster than the graph.
What is built here holds no reference cycles to reclaim, so the collector waits until
the build is done (it is never left off: the previous state comes back, also on error).
Only for what runs outside a traced forward: ``torch.compile`` cannot trace ``gc``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block, and restore its state after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
