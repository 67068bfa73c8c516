"""Per-example memory: a cached node remembered row by row of its batch.

``g.cache("enc", per="example")`` keys every row of the node's input batch by content::

    key(example) = H(node identity, declaration, state, row layout; the row's bytes)

so memory survives a shuffled ``DataLoader``, a sweep and a federated round. A batch
costs one batched hash (one keyed blake3 per row, by the row codec), one keeper lookup
for the whole batch (``get_many``), one call of the node on the stacked misses and one
``put_many`` of the miss rows; outputs are assembled in batch order, on the device the
node would have put them on.

The engine knows no tensor: a codec offers rows through a ``rows`` attribute shaped like
``RowCodec`` (``somatize.torch``: tensors, along dim 0). A batch is one such leaf, or a
tuple, list or dict (str keys) of leaves with the same number of rows; so is the output.

An entry holds one example's output: ``SMZR``, the layout's length, the layout (the
output's structure, each leaf's codec, row dtype and shape, bytes per row — canonical
data), then the leaves' row bytes. All entries of a node share the layout, so a batch of
hits is checked by comparing prefixes and assembled with one join per leaf. An entry that
does not match is a miss: it is discarded and computed again, never returned.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .errors import CacheError
from .explain import note
from .node import Ctx, Done, not_done
from .row_batches import Leaf, RowCodec, _rebuild, _split, device_of, place
from .values import Opaque, decode, encode, is_data
from .watchers import CacheRows, notify

if TYPE_CHECKING:
    from .keepers import Keeper
    from .keyed import Env, Forward

__all__ = [
    "ROWS_VERSION",
    "RowCodec",
    "check_entry",
    "device_of",
    "discard",
    "get_many",
    "place",
    "put_many",
    "remember",
]

ROWS_VERSION = "somatize.rows/1"
_MAGIC = b"SMZR"
_LEN = struct.Struct(">I")


def get_many(keeper: Keeper | None, keys: Sequence[str]) -> list[bytes | None]:
    """Entries under ``keys`` in one call (a keeper without ``get_many``: one by one)."""
    if keeper is None:
        return [None] * len(keys)
    many = getattr(keeper, "get_many", None)
    return list(many(keys)) if many is not None else [keeper.get(k) for k in keys]


def put_many(keeper: Keeper, items: Sequence[tuple[str, bytes]], pinned: bool) -> None:
    """Store entries in one call (a keeper without ``put_many``: one by one)."""
    many = getattr(keeper, "put_many", None)
    if many is not None:
        many(items, pinned=pinned)
    else:
        for k, data in items:
            keeper.put(k, data, pinned=pinned)


def _keys(leaves: list[Leaf], salt: bytes) -> list[str]:
    if len(leaves) == 1:
        _, rows, v = leaves[0]
        return rows.keys(v, salt)
    digests = [rows.digests(v) for _, rows, v in leaves]
    h, out = blake3(key=salt), []  # one keyed hasher, reset after each row
    for ds in zip(*digests):
        h.update(b"".join(ds))
        out.append(h.hexdigest())
        h.reset()
    return out


def _entries(kind: str, names: tuple[Any, ...], leaves: list[Leaf], n: int) -> list[bytes]:
    """One entry per row of an output batch."""
    blobs = [rows.rows(v) for _, rows, v in leaves]
    infos = tuple((tag, rows.layout(v), nb) for (tag, rows, v), (_, nb) in zip(leaves, blobs))
    memo: tuple[Any, ...] | None = (kind, names, infos)
    try:
        prefix = _prefixes.get(memo)  # type: ignore[arg-type]
    except TypeError:  # a codec's layout that does not hash: encoded every time
        prefix, memo = None, None
    if prefix is None:  # a node's batches share one layout: encoded once
        layout = encode((ROWS_VERSION, kind, names, list(infos)))
        prefix = _MAGIC + _LEN.pack(len(layout)) + layout
        if memo is not None:
            if len(_prefixes) > 256:
                _prefixes.clear()
            _prefixes[memo] = prefix
    if len(blobs) == 1:
        mv, nb = blobs[0]
        return [prefix + mv[i : i + nb] for i in range(0, n * nb, nb)] if nb else [prefix] * n
    return [b"".join([prefix, *(mv[i * nb : (i + 1) * nb] for mv, nb in blobs)]) for i in range(n)]


class _Layout:
    """The parsed layout of a node's entries: structure, and where each leaf's bytes lie."""

    def __init__(self, prefix: bytes, codecs: Sequence[Any]) -> None:
        self.prefix = prefix
        version, self.kind, names, infos = decode(prefix[8:])
        if version != ROWS_VERSION:
            raise ValueError(f"entry written by {version!r}")
        self.names = tuple(names)
        by_tag = {c.tag: getattr(c, "rows", None) for c in codecs}
        self.leaves: list[tuple[RowCodec, Any, int, int]] = []
        start = len(prefix)
        for tag, layout, nb in infos:
            rows = by_tag.get(tag)
            if rows is None:
                raise ValueError(f"entry needs codec {tag!r}, which was not passed")
            self.leaves.append((rows, layout, start, nb))
            start += nb
        self.size = start

    def build(self, entries: list[bytes], device: str | None) -> list[Any]:
        # One join of the whole entries, each leaf's rows read from it as a grid (one entry
        # a line): a slice per entry cost more than copying the entries' prefixes along.
        raw, n = bytearray().join(entries), len(entries)
        return [
            rows.build(layout, raw, n, device, (self.size, start, nb))
            for rows, layout, start, nb in self.leaves
        ]


# The key salt of a node's rows by (node parts, batch structure, row layouts).
_salts: dict[tuple[Any, ...], bytes] = {}
# Entry prefixes by (kind, field names, leaf layouts), encoded once.
_prefixes: dict[tuple[Any, ...], bytes] = {}
# Parsed layouts by (entry prefix, codec tags): a node's entries share one, parsed once.
_layouts: dict[tuple[bytes, tuple[str, ...]], _Layout] = {}


def _layout(entry: bytes, codecs: Sequence[Any]) -> _Layout:
    if entry[:4] != _MAGIC or len(entry) < 8:
        raise ValueError("not a per-example entry")
    (size,) = _LEN.unpack_from(entry, 4)
    memo = (entry[: 8 + size], tuple(c.tag for c in codecs))
    layout = _layouts.get(memo)
    if layout is None:
        if len(_layouts) > 256:
            _layouts.clear()
        layout = _layouts[memo] = _Layout(memo[0], codecs)
    return layout


def check_entry(entry: bytes, codecs: Sequence[Any]) -> bool:
    """Whether ``entry`` is a per-example row (False: some other kind of entry); raises
    ``ValueError`` when it is one that does not parse or whose length its layout does not
    give (``somatize cache verify``). A row needing a codec not in ``codecs`` raises the
    ``"which was not passed"`` error a data value would."""
    if entry[:4] != _MAGIC:
        return False
    layout = _layout(entry, codecs)
    if len(entry) != layout.size:
        raise ValueError(
            f"a per-example row of {len(entry)} bytes where its layout gives {layout.size}"
        )
    return True


def discard(keeper: Keeper | None, key: str) -> None:
    """Drop an entry that did not decode, so it is computed and written afresh."""
    drop = getattr(keeper, "discard", None)
    if drop is not None:
        drop(key)


def _recall(
    found: list[bytes | None], keys: list[str], env: Env
) -> tuple[_Layout | None, list[int], list[bytes]]:
    """The layout, positions and entries of the hits that fit; the rest become misses."""
    layout = None
    for i, e in enumerate(found):
        if e is not None:
            try:
                layout = _layout(e, env.codecs)
                break
            except Exception:  # torn, foreign or undecodable: a miss, computed again
                discard(env.keeper, keys[i])
                found[i] = None
    if layout is None:
        return None, [], []
    size, prefix = layout.size, layout.prefix
    where = [
        i for i, e in enumerate(found) if e is not None and len(e) == size and e.startswith(prefix)
    ]
    entries: list[bytes] = [found[i] for i in where]  # type: ignore[misc]
    if len(where) < len(found) - found.count(None):
        fits = set(where)
        for i, e in enumerate(found):
            if e is not None and i not in fits:
                discard(env.keeper, keys[i])
    return layout, where, entries


def remember(
    env: Env, node: str, label: str, impl: Any, inp: Any, ctx: Ctx, forward: Forward
) -> tuple[Any, str, Any]:
    """Run a node cached per example: (output in batch order, its key, the node's metrics)."""
    codecs, keeper = env.codecs, env.keeper
    kind, names, leaves, n = _split(inp, codecs, label, "input")
    parts = env.parts(node)  # (on another host: the caller's, sent with the slice)
    recipe = (parts, kind, names, tuple((tag, rows.layout(v)) for tag, rows, v in leaves))
    salt = _salts.get(recipe)
    if salt is None:  # the same node on batches of one layout: one salt, encoded once
        if len(_salts) > 1024:
            _salts.clear()
        salt = _salts[recipe] = blake3(encode((ROWS_VERSION, *recipe))).digest()
    keys = _keys(leaves, salt)
    node_key = blake3(salt + "".join(keys).encode()).hexdigest()
    layout, hit, entries = _recall(get_many(keeper, keys), keys, env)
    hits: list[Any] = []
    if layout is not None and entries:
        device = ctx.device or leaves[0][1].device(leaves[0][2])
        try:
            hits = layout.build(entries, device)
        except Exception:  # a checksummed entry that does not decode: recompute them all
            for i in hit:
                discard(keeper, keys[i])
            hit, entries = [], []
    hit_set = set(hit)
    miss = [i for i in range(n) if i not in hit_set] if hit else list(range(n))
    if env.watchers:
        event = CacheRows(ctx.run.id, label, ctx.run.step, len(hit), len(miss), tuple(keys))
        notify(env.watchers, event)
    if env.explained is not None:
        env.explained.append((label, impl, parts, f"{n} examples", (len(hit), len(miss))))
    if not miss and layout is not None:
        return _rebuild(layout.kind, layout.names, hits), node_key, None

    batch = (  # (an empty batch, n == 0, is computed: it has no rows to remember)
        inp if len(miss) == n else _rebuild(kind, names, [r.take(v, miss) for _, r, v in leaves])
    )
    done = forward(batch, ctx)
    if type(done) is not Done:
        raise not_done(label, impl, done)
    value, metrics = done
    if type(value) is Opaque:
        value = value.value
    if not is_data(value, codecs):
        raise CacheError(
            f"node {label!r} is cached per example but returned a {type(value).__qualname__} "
            f"that is not data (a tensor that requires grad?); freeze {label!r} or return "
            "detached tensors, or stop caching it"
        )
    okind, onames, oleaves, m = _split(value, codecs, label, "output")
    if m != len(miss):
        raise CacheError(
            f"node {label!r} is cached per example but returned {m} rows for {len(miss)} input "
            f"rows; per-example memory needs one output row per input row — cache it per "
            f"batch instead: g.cache({label!r})"
        )
    if keeper is not None:
        stored = _entries(okind, onames, oleaves, m)
        put_many(keeper, [(keys[i], e) for i, e in zip(miss, stored)], node in env.memory.pinned)
        note(keeper, label, impl, parts, None, env.node_keys.context())
    if not hits:  # (a dict as a hit gives it: its fields in sorted order)
        return _rebuild(okind, onames, [v for _, _, v in oleaves]), node_key, metrics
    merged = [rows.scatter([(miss, v), (hit, h)], n) for (_, rows, v), h in zip(oleaves, hits)]
    return _rebuild(okind, onames, merged), node_key, metrics
