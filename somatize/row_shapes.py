"""One shape of output row per input layout: what per-example memory checks of a node's rows.

A node cached per example serves each row from whatever batch computed it, so a row's
output must depend on that row alone — its shape and structure too. A node that cuts its
output to the batch's longest sequence breaks that, and a batch served wholly from memory
would silently get rows of another batch's length. Two checks catch it where rows are
computed (a batch that only hits does not run the node, so nothing can be seen there):

* the rows just computed beside rows a batch hit must be laid out as those (``check_fits``);
* every batch a process computes for one node state and input layout (one row-key salt)
  must give rows of one layout (``check_computed``): a fit's first epoch computes every
  row, so a batch-dependent shape is named there, before any batch is served wrongly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import CacheError

if TYPE_CHECKING:
    from .row_batches import Leaf
    from .row_entries import Layout

__all__ = ["check_computed", "check_fits"]

# row-key salt (node parts, input structure and row layouts) -> the layout of the rows
# this process computed for it: (kind, field names, each leaf's row layout)
_computed: dict[bytes, tuple[Any, ...]] = {}


def _described(kind: str, names: tuple[Any, ...], layouts: tuple[Any, ...]) -> str:
    """``float32 (3, 4)``, ``a dict {'pooled': float32 (16,), ...}``: rows as a message says them."""
    said = [" ".join(map(str, lay)) if type(lay) is tuple else repr(lay) for lay in layouts]
    if kind == "leaf":
        return said[0]
    if kind == "dict":
        return "a dict {" + ", ".join(f"{k!r}: {s}" for k, s in zip(names, said)) + "}"
    return f"a {kind} ({', '.join(said)})"


def _error(label: str, now: tuple[Any, ...], before: tuple[Any, ...], where: str) -> CacheError:
    return CacheError(
        f"node {label!r} is cached per example, but the rows it computed now are "
        f"{_described(*now)} where the rows it {where} for this input layout are "
        f"{_described(*before)}; a row's output must depend on that row alone, its shape and "
        "structure too (an output cut or padded to the batch's longest sequence depends on "
        "the other rows) — give each row an output of its own fixed shape (pad or cut to a "
        f"fixed length), or cache it per batch: g.cache({label!r})"
    )


def check_fits(
    label: str, layout: Layout, kind: str, names: tuple[Any, ...], leaves: list[Leaf]
) -> None:
    """Raise ``CacheError`` when the rows just computed are not laid out as the rows a batch
    hit (their structure, dtype or shape): a row's output then depends on the other rows."""
    found = tuple(lay for _, lay, _, _ in layout.leaves)
    now = tuple(rows.layout(v) for _, rows, v in leaves)
    if (layout.kind, layout.names, found) != (kind, names, now):
        before = (layout.kind, layout.names, found)
        raise _error(label, (kind, names, now), before, "remembered")


def check_computed(
    label: str, salt: bytes, kind: str, names: tuple[Any, ...], leaves: list[Leaf]
) -> None:
    """Raise ``CacheError`` when rows computed for ``salt`` (one node state, one input
    layout) are laid out otherwise than the rows this process computed for it before."""
    now = (kind, names, tuple(rows.layout(v) for _, rows, v in leaves))
    before = _computed.get(salt)
    if before is None:
        if len(_computed) > 1024:
            _computed.clear()
        _computed[salt] = now
    elif before != now:
        raise _error(label, now, before, "computed in an earlier batch")
