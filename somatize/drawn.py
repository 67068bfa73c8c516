"""A node that drew random numbers, upstream of a remembered node: keyed by its output.

Keys are recipes, ``key(node) = H(identity, declaration, state, keys of its inputs)``:
they say what a node will compute, which holds only if the same recipe gives the same
output. A node drawing from a global generator breaks that — a random augmentation
before a cached encoder gives one key for a new draw at every call, so the encoder would
serve the first draw's features ever after (test-time augmentation averaging one draw).

So a node whose key feeds a cached or named node's key (``Program.watched``), and that
is not itself cached, runs through the runtime's ``draws`` hook (``Graph.use(wrap=...)``:
``wrap.draws(forward, x, ctx) -> (result, drew)``; ``somatize.torch`` reads its global
generators before and after). When it drew, its key is the content key of its output —
what a graph input with that content gets — so the nodes below are keyed by what they
actually receive: an exact, content-based memory. Its output is data, or an Opaque
holding data; anything else cannot say what was drawn, and raises ``CacheError``.

A node cached itself keeps its recipe key: it runs only on a miss, its output is served
under that key, and its draws are warned of by the runtime (``somatize/torch/draws.py``).
A generator the node holds is part of its state, so it enters the key already.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import CacheError
from .values import digest, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["drawn_key"]


def drawn_key(label: str, value: Any, opaque: bool, codecs: Sequence[Codec]) -> str:
    """The key of node ``label``, which drew random numbers: the content key of its output.

    Raises:
        CacheError: the output is Opaque and holds what is not data (a tensor that
            requires grad), so no key can say what was drawn.
    """
    if opaque and not is_data(value, codecs):
        raise CacheError(
            f"node {label!r} drew random numbers in its forward (torch.randn, dropout in "
            "training mode, a random transform, random or np.random) and a cached or named "
            "node below it is keyed by its key, so it is keyed by the content of its output, "
            f"but that is Opaque, holding a {type(value).__qualname__} that is not data (a "
            f"tensor that requires grad): return data from {label!r} (a detached tensor: "
            "Done(x), not Done(Opaque(x))), move the randomness after the cached node, or "
            "stop caching the nodes below it"
        )
    return digest(value, codecs, f"the output of node {label!r}")
