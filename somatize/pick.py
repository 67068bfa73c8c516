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
    """A node returning part of its input: a position of the graph's inputs (``Pick(1)`` for
    ``g.forward(images, texts)``) or a key of a dict batch (``Pick("pixel_values")``); given
    several, a tuple of those positions or a dict of those keys (``Pick("input_ids",
    "attention_mask")`` out of a processor's flat batch).

    Args:
        keys: int positions (negative counts from the end), or str dict keys.

    Raises:
        NodeError (when run): the input has no such position or key, naming what it has.

    Example:
        >>> from somatize import Graph, Pick
        >>> Graph.somatize(Pick(1)).forward("image", "text")
        'text'
        >>> Graph.somatize(Pick("ids", "mask")).forward({"pixels": 0, "ids": 1, "mask": 2})
        {'ids': 1, 'mask': 2}
    """

    def __init__(self, *keys: int | str) -> None:
        ints = all(type(k) is int for k in keys)
        if not keys or not (ints or all(type(k) is str for k in keys)):
            shown = ", ".join(f"{type(k).__qualname__} {k!r:.40}" for k in keys) or "nothing"
            raise TypeError(
                f"Pick(*keys) takes int positions or str dict keys, one kind, not {shown}; "
                "e.g. Pick(1) for the second input, Pick('input_ids', 'attention_mask')"
            )
        if len(set(keys)) != len(keys):
            raise TypeError(f"Pick{keys!r} names a key twice; name each once")
        self.keys = keys

    def forward(self, x: Any, ctx: Ctx) -> Done:
        keys = self.keys
        shown = ", ".join(map(repr, keys))
        if isinstance(x, Mapping):
            missing = [k for k in keys if k not in x]
            if missing:
                have = ", ".join(printable(repr(k)) for k in list(x)[:8])
                raise KeyError(
                    f"Pick({shown}) got a dict without {', '.join(map(repr, missing))} (its "
                    f"keys: {have}); pick among them"
                )
            value: Any = x[keys[0]] if len(keys) == 1 else {k: x[k] for k in keys}
        elif isinstance(x, Sequence) and not isinstance(x, (str, bytes)) and type(keys[0]) is int:
            at = [k for k in keys if type(k) is int]  # (all of them: one kind, checked)
            if any(not -len(x) <= k < len(x) for k in at):
                raise IndexError(
                    f"Pick({shown}) got {len(x)} inputs; pick 0 to {len(x) - 1} (a root "
                    "receives every input of the call as one tuple, in order)"
                )
            value = x[at[0]] if len(at) == 1 else tuple(x[k] for k in at)
        else:
            what = "str keys need a dict batch" if type(keys[0]) is str else "nothing to index"
            raise TypeError(
                f"Pick({shown}) got one {type(x).__qualname__}, {what}: a graph called with "
                "one input gives it to its roots whole; Pick selects among several inputs "
                "(g.forward(a, b)) or the keys of a dict batch"
            )
        parts = value.values() if type(value) is dict else value if type(value) is tuple else ()
        if any(getattr(v, "requires_grad", False) is True for v in (value, *parts)):
            return Done(Opaque(value))  # (its autograd graph, as the call's input had it)
        return Done(value)
