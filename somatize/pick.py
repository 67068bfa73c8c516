"""``Pick(k)``: one of the graph's inputs, for a root that reads only its own.

A root node receives every input of the call as one tuple (a dict batch as the dict), so
a node remembered per example there is keyed by all of them: in a two-tower model whose
images are augmented afresh each epoch, a frozen text tower reading ``inputs[1]`` misses
every row, because each row holds an image too. ``Pick(1) >> TextTower()`` gives the
tower its input alone, so its rows are keyed by the texts alone and hit from the second
epoch on (per-example rows are keyed by their content: docs/caching.md)::

    g = Graph.somatize((Pick(0) >> ImageTower() | Pick(1) >> TextTower().with_id("txt"))
                       >> Score())
    g.freeze("txt").cache("txt", per="example")
    st.module(g)(images, texts)

A value that requires grad is returned ``Opaque`` (its autograd graph kept, as the
input's); anything else as data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .node import Ctx, Done, Node
from .printable import printable
from .values import Opaque

__all__ = ["Pick"]


class Pick(Node):
    """A node returning ``x[key]`` of its input: a position of the graph's inputs (``Pick(1)``
    for ``g.forward(images, texts)``), or a key of a dict batch (``Pick("text")``).

    Args:
        key: an int position (negative counts from the end) or a dict key.

    Raises:
        NodeError (when run): the input has no such position or key, naming what it has.

    Example:
        >>> from somatize import Graph, Pick
        >>> Graph.somatize(Pick(1)).forward("image", "text")
        'text'
        >>> Graph.somatize(Pick("y")).forward({"x": 1, "y": 2})
        2
    """

    def __init__(self, key: int | str) -> None:
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(
                f"Pick(key) takes an int position or a str dict key, not "
                f"{type(key).__qualname__} {key!r:.40}; e.g. Pick(1) for the second input"
            )
        self.key = key

    def forward(self, x: Any, ctx: Ctx) -> Done:
        key = self.key
        if isinstance(x, Mapping):
            if key not in x:
                keys = ", ".join(printable(repr(k)) for k in list(x)[:8])
                raise KeyError(
                    f"Pick({key!r}) got a dict without that key (its keys: {keys}); pick one "
                    "of them"
                )
            value = x[key]
        elif isinstance(x, Sequence) and not isinstance(x, (str, bytes)) and type(key) is int:
            if not -len(x) <= key < len(x):
                raise IndexError(
                    f"Pick({key}) got {len(x)} inputs; pick 0 to {len(x) - 1} (a root receives "
                    "every input of the call as one tuple, in order)"
                )
            value = x[key]
        else:
            what = "a str key needs a dict batch" if isinstance(key, str) else "nothing to index"
            raise TypeError(
                f"Pick({key!r}) got one {type(x).__qualname__}, {what}: a graph called with "
                "one input gives it to its roots whole; Pick selects among several inputs "
                "(g.forward(a, b)) or the keys of a dict batch"
            )
        if getattr(value, "requires_grad", False) is True:
            return Done(Opaque(value))  # (its autograd graph, as the call's input had it)
        return Done(value)
