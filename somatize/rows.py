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

An entry holds one example's output: a prefix naming its layout (the output's structure,
each leaf's codec, row dtype and shape, bytes per row), then the leaves' row bytes
(``row_entries.py``). All entries of a node share the prefix, so a batch of hits is
checked by comparing prefixes and assembled with one join. An entry that does not match
is a miss: it is discarded and computed again, never returned.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .cache_warnings import warn_changed_itself, wrote_input
from .errors import CacheError, ValueConversionError
from .explain import note
from .node import Ctx, Done, not_done
from .row_batches import (
    Leaf,
    RowCodec,
    _rebuild,
    _split,
    device_of,
    one_per_example,
    place,
    transposed,
    unbatched,
    versions,
)
from .row_entries import ROWS_VERSION, Layout, check_entry, encode_rows, is_current, layout_of
from .row_shapes import check_computed, check_fits
from .values import Opaque, check, encode, is_data
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


def not_data_fix(label: str, frozen: bool) -> str:
    """The fix for a cached node returning what is not data (a tensor that requires grad)."""
    if frozen:  # frozen already: its forward turned grad back on, or returned a parameter
        return (
            f"{label!r} is frozen, so its forward runs without grad: return tensors computed "
            "in it (not under torch.enable_grad(), not a parameter itself), or .detach() them"
        )
    return f"freeze {label!r} (g.freeze({label!r})) or return detached tensors"


def _requires_grad(value: Any) -> bool:
    """Whether a leaf of ``value`` (in plain tuples, lists and dicts) requires grad."""
    if type(value) in (tuple, list):
        return any(_requires_grad(v) for v in value)
    if type(value) is dict:
        return any(_requires_grad(v) for v in value.values())
    return getattr(value, "requires_grad", False) is True


def _no_opaque(reason: str) -> str:
    """``reason`` without its Opaque fix: a cached node's output is stored, Opaque or not."""
    return re.sub(r",? or wrap (it|the dict) in Opaque\(\.\.\.\)[^;,—]*", "", reason)


def not_stored(label: str, e: ValueConversionError, how: str) -> ValueConversionError:
    """``e``, raised storing the output of a node ``how`` cached, said of the node, without
    its Opaque fix (a cached node's output is stored, Opaque or not)."""
    reason = str(e).partition(": cannot pass ")[2] or str(e)
    return ValueConversionError(
        f"node {label!r} is {how}, so its output is stored as data, but it returned "
        f"{_no_opaque(reason)}, or stop caching it"
    )


def not_data(label: str, value: Any, codecs: Sequence[Any], frozen: bool, how: str) -> CacheError:
    """The error for a node ``how`` cached (``"cached per example"``) that returned what is
    not data: a tensor that requires grad (freeze the node, or detach), or a value data
    does not hold — a namedtuple, an ``OrderedDict`` (a HuggingFace ``ModelOutput``), a
    set — named with its own fix. (A cached node's output is stored: Opaque is no way out.)"""
    if not _requires_grad(value):
        try:
            check(value, codecs, where="")
        except ValueConversionError as e:
            at, _, reason = str(e).partition(": cannot pass ")
            reason = _no_opaque(reason)
            where = at.strip().removeprefix("at ")
            of = f" ({where} of it)" if where else ""
            return CacheError(
                f"node {label!r} is {how}, so its output is stored as data, but it returned "
                f"{reason}{of}, or stop caching it"
            )
    what = (
        "" if getattr(value, "requires_grad", False) else f"{type(value).__qualname__} holding a "
    )
    return CacheError(
        f"node {label!r} is {how} but returned a {what}tensor that requires grad; "
        f"{not_data_fix(label, frozen)}, or stop caching it"
    )


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


# keeper -> the keys this process pinned in it on a hit (each pinned once)
_PINNED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def pin_found(keeper: Keeper | None, keys: Sequence[str]) -> None:
    """Pin entries a pinned node found (stored before ``g.pin``, or by an unpinned run):
    the node's entries survive ``gc``, not only those it wrote. Each key once a process."""
    pin = getattr(keeper, "pin", None)  # (a keeper of the protocol's methods alone: none)
    if pin is None or not keys:
        return
    try:
        seen = _PINNED.setdefault(keeper, set())
    except TypeError:  # (a keeper that takes no weak reference: pinned every time)
        seen = set()
    for k in keys:
        if k not in seen:
            pin(k)
            seen.add(k)


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


# The key salt of a node's rows by (node parts, batch structure, row layouts).
_salts: dict[tuple[Any, ...], bytes] = {}


def discard(keeper: Keeper | None, key: str) -> None:
    """Drop an entry that did not decode, so it is computed and written afresh."""
    drop = getattr(keeper, "discard", None)
    if drop is not None:
        drop(key)


def _recall(
    found: list[bytes | None], keys: list[str], env: Env
) -> tuple[Layout | None, list[int], list[bytes]]:
    """The layout, positions and entries of the hits that fit; the rest become misses.

    The hits must share one layout: the first entry's of the form written now, else the
    first's. An entry of the older form beside it is a miss (computed again, so rewritten
    in the current form); one that does not parse or fit is discarded."""
    layout = None
    for i, e in enumerate(found):
        if e is not None:
            try:
                layout = layout_of(e, env.codecs)
            except Exception:  # torn, foreign or undecodable: a miss, computed again
                discard(env.keeper, keys[i])
                found[i] = None
                continue
            if layout.current:
                break
            newer = next((e for e in found[i + 1 :] if e is not None and is_current(e)), None)
            if newer is not None:
                with contextlib.suppress(Exception):  # (if not: kept, computed again below)
                    layout = layout_of(newer, env.codecs)
            break
    if layout is None:
        return None, [], []
    size, prefix = layout.size, layout.prefix
    every: list[bytes] = found  # type: ignore[assignment]  # (if None is not in it)
    try:  # all hits, of one size and prefix: checked at C speed (len(None): a miss)
        n = len(every)
        if (
            list(map(len, every)).count(size) == n
            and list(map(layout.head, every)).count(prefix) == n
        ):
            return layout, list(range(n)), every
    except TypeError:
        pass
    where = [
        i for i, e in enumerate(found) if e is not None and len(e) == size and e.startswith(prefix)
    ]
    entries: list[bytes] = [found[i] for i in where]  # type: ignore[misc]
    if len(where) < len(found) - found.count(None):
        fits = set(where)
        for i, e in enumerate(found):
            if e is not None and i not in fits and (layout.current == is_current(e)):
                discard(env.keeper, keys[i])
    return layout, where, entries


def _distinct(miss: list[int], keys: Sequence[str]) -> tuple[list[int], list[int] | None]:
    """The rows to compute — the first of each distinct key among ``miss`` — and, when some
    repeat (a sampler drawing with replacement), where each of ``miss`` is among them."""
    if len(miss) < 2 or len({keys[i] for i in miss}) == len(miss):
        return miss, None
    first: dict[str, int] = {}
    computed: list[int] = []
    for i in miss:
        if keys[i] not in first:
            first[keys[i]] = len(computed)
            computed.append(i)
    return computed, [first[keys[i]] for i in miss]


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
    try:
        keys = _keys(leaves, salt)
    except ValueConversionError as e:  # (a tensor subclass: say which node met it)
        raise ValueConversionError(
            f"node {label!r} is cached per example, but its input holds {e}"
        ) from None
    node_key = blake3(salt + "".join(keys).encode()).hexdigest()
    layout, hit, entries = _recall(get_many(keeper, keys), keys, env)
    if hit and node in env.memory.pinned:
        pin_found(keeper, [keys[i] for i in hit])
    hits: list[Any] = []
    if layout is not None and entries:
        device = ctx.device or leaves[0][1].device(leaves[0][2])
        try:
            hits = layout.build(entries, device)
        except Exception:  # a checksummed entry that does not decode: recompute them all
            for i in hit:
                discard(keeper, keys[i])
            hit, entries = [], []
    if len(hit) == n:
        miss: list[int] = []
    else:
        hit_set = set(hit)
        miss = [i for i in range(n) if i not in hit_set] if hit else list(range(n))
    if env.watchers:
        layout_in = recipe[1:]  # (the input rows' layout: the recipe less the node's parts)
        event = CacheRows(
            ctx.run.id, label, ctx.run.step, len(hit), len(miss), tuple(keys), layout_in
        )
        notify(env.watchers, event)
    if env.explained is not None:
        env.explained.append((label, impl, parts, f"{n} examples", (len(hit), len(miss))))
    if not miss and layout is not None:
        return _rebuild(layout.kind, layout.names, hits), node_key, None

    computed, expand = _distinct(miss, keys)  # a row repeated in the batch: computed once
    if len(computed) != n:  # (an empty batch, n == 0, is computed: it has no rows to remember)
        leaves = [(tag, r, r.take(v, computed)) for tag, r, v in leaves]
    batch = inp if len(computed) == n else _rebuild(kind, names, [v for _, _, v in leaves])
    before = versions(leaves)
    done = forward(batch, ctx)
    if versions(leaves) != before:
        wrote_input(label, impl)
    if type(done) is not Done:
        raise not_done(label, impl, done)
    value, metrics = done
    if type(value) is Opaque:
        value = value.value
    if not is_data(value, codecs):
        raise not_data(label, value, codecs, node in env.memory.frozen, "cached per example")
    okind, onames, oleaves, m = _split(value, codecs, label, "output")
    if m != len(computed):
        # one tensor per example, in the output, or in the input (then stacked by the node)
        hint = one_per_example(okind, oleaves, "output") * (len(oleaves) == len(computed))
        hint = hint or one_per_example(kind, leaves, "input") * (len(leaves) == m)
        raise CacheError(
            f"node {label!r} is cached per example but returned {m} row{'s' * (m != 1)} for "
            f"{len(computed)} input rows; per-example memory needs one output row per input "
            f"row{hint} — cache it per batch instead: g.cache({label!r}){unbatched(kind)}"
        )
    if (refused := transposed(label, okind, oleaves, m)) is not None:
        raise refused
    if hits and layout is not None:  # (checked before storing: such rows are not kept)
        check_fits(label, layout, okind, onames, oleaves)
    if keeper is not None:
        if m:  # (an empty batch's output may have any shape: it stores no row)
            check_computed(label, salt, okind, onames, oleaves)
        try:
            stored = encode_rows(okind, onames, oleaves, m)
        except ValueConversionError as e:  # (a tensor subclass: its type would not be kept)
            raise not_stored(label, e, "cached per example") from None
        pinned = node in env.memory.pinned
        put_many(keeper, [(keys[i], e) for i, e in zip(computed, stored)], pinned)
        note(keeper, label, impl, parts, None, env.node_keys.context())
        # (a frozen node's modules are put in eval mode around its forward)
        if node not in env.memory.frozen and env.parts(node)[2] != parts[2]:
            warn_changed_itself(label, impl)
    if expand is not None:  # each repeated row's output, at every place it was asked for
        oleaves = [(tag, r, r.take(v, expand)) for tag, r, v in oleaves]
    if not hits:  # (a dict as a hit gives it: its fields in sorted order)
        return _rebuild(okind, onames, [v for _, _, v in oleaves]), node_key, metrics
    merged = [rows.scatter([(miss, v), (hit, h)], n) for (_, rows, v), h in zip(oleaves, hits)]
    return _rebuild(okind, onames, merged), node_key, metrics
