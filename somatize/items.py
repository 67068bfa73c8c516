"""A cached mapped node (``node.mapped()``, ``g.cache``): each item of its list keyed by
its own content and remembered alone, so only the items missing are computed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import rows
from .decoding import in_decoded_order
from .errors import CacheError, NodeError
from .explain import note
from .memory import key
from .node import Ctx, Done, Mapped, item_metrics, not_done
from .values import Opaque, decode, digest, encode, is_data
from .watchers import CacheHit, CacheMiss, notify

if TYPE_CHECKING:
    from .keyed import Env

__all__ = ["mapped"]


def mapped(
    env: Env, node: str, label: str, impl: Mapped, items: Any, ctx: Ctx
) -> tuple[list[Any], dict[str, Any] | None]:
    """A cached mapped node: each item keyed by its own content; only misses computed.
    Returns the values and the merged metrics of the items computed (a hit reports none,
    as a whole node's hit does)."""
    if type(items) is not list and type(items) is not tuple:
        raise NodeError(
            f"mapped node {label!r} received a {type(items).__name__}; it takes a list — for a "
            f"tensor batch, cache the node itself per example: g.cache({label!r}, per='example')"
        )
    codecs, keeper, watchers, run = env.codecs, env.keeper, env.watchers, ctx.run
    pinned = node in env.memory.pinned
    inner = env.forward(node, impl.inner)
    # The recipe of one item: the inner node on that item's content (not the mapped
    # node's own key, which a list whose item is a whole earlier input would share).
    # The inner node's parts are read once per batch, not once per item.
    parts = env.parts(node)
    out = []
    reported = []
    hits = 0
    for i, item in enumerate(items):
        item_key = key(*parts, [digest(item, codecs, f"item {i} of the input of {label!r}")])
        hit = keeper.get(item_key) if keeper is not None else None
        if hit is not None:
            notify(watchers, CacheHit(run.id, f"{label}[{i}]", item_key))
            if pinned:
                rows.pin_found(keeper, [item_key])
            out.append(decode(hit, codecs))
            hits += 1
            continue
        notify(watchers, CacheMiss(run.id, f"{label}[{i}]", item_key))
        done = inner(item, ctx)
        if type(done) is not Done:
            raise not_done(label, impl.inner, done)
        value = done.value
        reported.append(done.metrics)
        if type(value) is Opaque:  # as for a whole node: an Opaque holding data is stored
            value = value.value
            if not is_data(value, codecs):
                raise CacheError(
                    f"cached mapped node {label!r} returned Opaque holding a "
                    f"{type(value).__qualname__} for item {i}, which is not data; cached items "
                    "must be data — return data or stop caching it"
                )
        if keeper is not None:
            data = encode(value, codecs, f"item {i} of the output of node {label!r}")
            keeper.put(item_key, data, pinned=pinned)
        out.append(in_decoded_order(value))
    misses = len(out) - hits
    if misses and keeper is not None:  # what g.explain compares a later miss with
        note(keeper, label, impl, parts, None, env.node_keys.context())
    if env.explained is not None:
        env.explained.append((label, impl, parts, f"{len(out)} items", (hits, misses)))
    return out, item_metrics(reported)
