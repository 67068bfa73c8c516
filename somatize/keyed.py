"""The keyed path: walking steps with keys, the keeper and watchers.

One loop serves every run that needs keys: ``Program.run_keyed`` (a graph on one
host, and each subgraph node inside it) and each slice of a plan placed on several
hosts (``hosts.py`` on the caller, ``slices.py`` on a worker). An ``Env`` says how they
differ: where forwards come from, and how a node's key is obtained — computed as the
walk goes, or looked up among the keys the caller sent with a slice.

Keys are recipe keys, ``key(node) = H(identity, declaration, state, keys of its
predecessors)``; they run through Opaque values too, and start from the content of the
input: below an input without a key no node has one, and a cached or named node there
raises ``CacheError`` (a cached mapped node still keys each item by its content). A node
whose key feeds a remembered node's key and that drew random numbers is keyed by the
content of its output instead (``drawn.py``), and so is a ``Pick`` that returns data:
by what it picks, even out of an Opaque input (beside an image that requires grad).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import rows
from .cache_warnings import warn_changed_itself, warn_ctx_reads
from .decoding import in_decoded_order
from .drawn import drawn_key
from .errors import CacheError, DeclarationError, ValueConversionError
from .explain import note
from .items import mapped
from .memory import Memory, NodeKeys
from .node import Ctx, Done, Mapped, Run, not_done
from .node_notes import name_node
from .pick import Pick
from .values import Opaque, check, decode, digest, encode, is_data
from .watchers import CacheHit, CacheMiss, Metrics, NodeEnd, NodeStart, Watcher, notify

if TYPE_CHECKING:
    from .codecs import Codec
    from .execute import Program
    from .keepers import Keeper

__all__ = ["Env", "Forward", "Walk", "keyed_impl", "name_node", "recipe_key", "walk"]

Forward = Callable[[Any, Ctx], Any]
_INPUT = "the graph input"


def _where(node: str) -> str:
    return f"the output of node {node!r}"


def keyed_impl(impl: Any) -> Any:
    """What keys the items of a mapped node (its inner node) or the rows of a node (itself)."""
    return impl.inner if isinstance(impl, Mapped) else impl


def recipe_key(keys: NodeKeys, impl: Any, label: str, in_keys: Sequence[str | None]) -> str | None:
    """The key of node ``label`` from its inputs' keys; None when an input has none."""
    known = [k for k in in_keys if k is not None]
    if len(known) < len(in_keys):
        return None
    try:
        return keys.of(impl, known)
    except DeclarationError as e:
        raise DeclarationError(
            f"node {label!r} needs a key (it is cached or named, or feeds a node that is) but {e}"
        ) from None


@dataclass
class Env:
    """What walking steps with keys needs besides the values: one per run (or slice).

    The single-process keyed path and a slice of a distributed plan differ only here:
    where forwards and subprograms come from, and how a node's key is obtained —
    computed as the walk goes, or looked up among the keys the caller sent with a slice.
    """

    impls: Mapping[str, Any]
    forward: Callable[[str, Any], Forward]  # node id, implementation -> its forward
    subprogram: Callable[[str], Program | None]
    key: Callable[[str, Any, Sequence[str | None]], str | None]  # node, impl, input keys
    # (identity, declaration, state) of what keys a node's items or rows: a cached mapped
    # node's inner node, a node cached per example itself (see ``keyed_impl``)
    parts: Callable[[str], tuple[str, str, str]]
    memory: Memory
    codecs: Sequence[Codec]
    devices: Mapping[str, str]
    keeper: Keeper | None
    node_keys: NodeKeys  # keys inside subgraph nodes
    watchers: Sequence[Watcher]
    run: Run
    host: str | None = None  # named in the note added to a node's error
    prefix: str = ""  # of node labels: "sub/" inside subgraph node "sub"
    # g.explain's record of what each remembered node looked up (None: not explaining)
    explained: list[Any] | None = None
    # the runtime's hook (``Graph.use(wrap=...)``), wrapped around a subgraph node's run
    # as around any node's forward: a frozen subgraph runs as a frozen node does
    wrap: Callable[[str, Any, Forward], Forward] | None = None
    # the runtime's ``draws(forward, x, ctx) -> (result, drew)`` (``drawn.py``), through
    # which the nodes in ``watched`` run: those whose key feeds a remembered node's key
    draws: Callable[[Forward, Any, Ctx], tuple[Any, bool]] | None = None
    watched: Collection[str] = frozenset()
    # the Picks whose key is needed: keyed by what they pick, with or without the input's
    picks: Collection[str] = frozenset()


@dataclass
class Walk:
    """What a walk has made, by node id (slot); the slices of one run add to one Walk."""

    values: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str | None] = field(default_factory=dict)  # they run through Opaque too
    opaque: set[str] = field(default_factory=set)  # nodes whose output is Opaque
    metrics: dict[str, Any] = field(default_factory=dict)
    drawn: set[str] = field(default_factory=set)  # keyed by their output: they drew
    # keyed by content below an Opaque input: a Pick of data, and what it alone feeds
    anew: set[str] = field(default_factory=set)


def walk(
    env: Env,
    steps: Sequence[tuple[str, tuple[str, ...]]],
    x: Any,
    x_opaque: bool,
    x_key: str | None,
    done: Walk,
    keyless_from: str | None = None,
) -> None:
    """Run ``steps`` (node id, input slots) with keys, the keeper and watchers, into ``done``.

    Args:
        x_key: the input's content key (None when Opaque or not needed).
        keyless_from: where a missing input key began, when it began above this walk.

    Raises what the nodes raise, with a note naming the node (and the host, if set).
    """
    memory, codecs, keeper, run = env.memory, env.codecs, env.keeper, env.run
    watchers, prefix = env.watchers, env.prefix
    values, vkeys, opaque, metrics = done.values, done.keys, done.opaque, done.metrics
    anew = done.anew
    the_input = f"the input of subgraph {prefix[:-1]!r}" if prefix else _INPUT
    # Keys start from the content of the input. Every node descends from a root, and every
    # root reads the input: below an input without a key, no node has one, in any slice.
    walk_keyless = None
    if x_key is None and (x_opaque or keyless_from is not None):
        walk_keyless = keyless_from or the_input
    on_host = f" on host {env.host!r}" if env.host is not None else ""
    draws, watched = env.draws, env.watched
    for node, inputs in steps:
        label = prefix + node
        if not inputs:
            inp, in_keys = x, [x_key]
            source = the_input if x_opaque else None
        else:
            got = [values[i] for i in inputs]
            inp = got[0] if len(inputs) == 1 else tuple(got)
            in_keys = [vkeys.get(i) for i in inputs]
            source = next((f"node {prefix + i!r}" for i in inputs if i in opaque), None)
        impl = env.impls[node]
        remembered = memory.remembers(node)
        # (but where a Pick took data out of it, keyed by that content: ``anew``)
        keyless = walk_keyless
        if keyless is not None and inputs and all(i in anew for i in inputs):
            keyless = None
            anew.add(node)
        # a cached mapped node is cached item by item, never as a whole list; a node cached
        # per example, row by row of its batch: both key their input by its content
        per_row = node in memory.per_example
        per_item = per_row or (node in memory.cached and isinstance(impl, Mapped))
        if remembered and source is not None:
            fix = (
                "pass data as the graph input (a tensor that requires grad, as module(g) gets "
                "it, is wrapped in Opaque: pass x.detach())"
                if source == the_input
                else f"return data (a detached tensor) from {source}: Done(x), not Done(Opaque(x))"
            )
            after = next((i for i in inputs if i in opaque), None)  # (None: the graph input)
            if node in memory.frozen and after is not None and after not in memory.frozen:
                fix = (
                    f"a frozen node passes gradients through to a trainable node before it, so "
                    f"its input keeps them and has no key: cache a frozen node only where what "
                    f"reaches it is data — return data from {source}: Done(x), not "
                    f"Done(Opaque(x)) (enough for a step without weights, a normalisation), "
                    f"and freeze {source} too if it has weights (a trainable node's output "
                    f"requires grad, so it cannot be data)"
                )
            what = f"its input, {source}," if source == the_input else f"its input from {source}"
            raise CacheError(
                f"node {label!r} is cached but {what} is Opaque; "
                f"Opaque values cannot enter a key — {fix}, or stop caching {label!r}"
            )
        # (a cached mapped node still keys each item by its content)
        if keyless is not None and remembered and (not per_item or node in memory.named):
            raise CacheError(
                f"node {label!r} is cached or named but has no key: upstream, "
                f"{keyless} is Opaque, and keys start from the content of the graph "
                f"input — pass data (a detached tensor) as the input, or stop caching {label!r}"
            )
        node_key = env.key(node, impl, in_keys) if keyless is None and not per_row else None
        if node_key is not None or per_row:  # (a row's key holds no more of ctx)
            warn_ctx_reads(label, impl, run.training and node not in memory.frozen)
        if node_key is not None and node in memory.cached and not per_item:
            hit = _recall(env, node_key, inp, env.devices.get(node))
            if env.explained is not None:
                parts = env.node_keys.parts(impl)
                env.explained.append((label, impl, parts, digest(tuple(in_keys)), hit is not None))
            if hit is not None:
                notify(watchers, CacheHit(run.id, label, node_key))
                if node in memory.pinned:  # (an entry stored before g.pin, or unpinned)
                    rows.pin_found(keeper, [node_key])
                if node in memory.named and keeper is not None:  # the name follows each run
                    keeper.name(memory.named[node], node_key)
                values[node], vkeys[node] = hit[0], node_key
                continue
            notify(watchers, CacheMiss(run.id, label, node_key))

        ctx = Ctx(node, env.devices.get(node), run)
        sub = env.subprogram(node)
        # the parts the key was made of, before forward can change the node's state
        stored = remembered and not per_item and node_key is not None and keeper is not None
        before = env.node_keys.parts(impl) if stored else None
        node_metrics = None
        # a node keying a remembered one runs through the runtime's ``draws``: if it drew,
        # its recipe key would repeat for another output (``drawn.py``)
        watch = draws if node_key is not None and node in watched else None
        drew = False
        if watchers:
            notify(watchers, NodeStart(run.id, label, run.step))
        start = time.perf_counter()
        try:
            if per_row:  # (a subgraph too: its rows computed by its program, frozen)
                forward = env.forward(node, impl)
                value, node_key, node_metrics = rows.remember(
                    env, node, label, impl, inp, ctx, forward
                )
                is_opaque = False
                if sub is not None and node_metrics:  # by inner node, as below
                    inner, node_metrics = node_metrics, None
                    metrics.update({f"{node}/{k}": v for k, v in inner.items()})
                    for k, v in inner.items():
                        notify(watchers, Metrics(run.id, f"{label}/{k}", run.step, v))
            elif sub is not None:
                o, drew = _run_sub(
                    env, sub, node, impl, inp, ctx, source, in_keys, node_key, keyless, watch
                )
                value, is_opaque = o.value, o.opaque
                metrics.update({f"{node}/{k}": v for k, v in o.metrics.items()})
            elif per_item:
                value, node_metrics = mapped(env, node, label, impl, inp, ctx)
                is_opaque = False
            else:
                if watch is None:
                    result = env.forward(node, impl)(inp, ctx)
                else:
                    result, drew = watch(env.forward(node, impl), inp, ctx)
                if type(result) is not Done:
                    raise not_done(label, impl, result)
                value, node_metrics = result
                is_opaque = type(value) is Opaque
                if is_opaque:
                    value = value.value
        except Exception as e:
            fed = {n for _, i in steps for n in i}
            roots = [prefix + n for n, i in steps if not i]
            sinks = [prefix + n for n, _ in steps if n not in fed]
            name_node(e, label, impl, on_host, inputs, x, roots, sinks)
            raise
        if watchers:
            notify(watchers, NodeEnd(run.id, label, run.step, time.perf_counter() - start))

        if is_opaque and remembered:
            # Caching was asked for: an Opaque that holds data (a frozen encoder's tensor,
            # computed without grad) is stored as that data; anything else cannot be.
            if not is_data(value, codecs):
                raise rows.not_data(label, value, codecs, node in memory.frozen, "cached or named")
            is_opaque = False
        if drew:  # keyed by what it gave, as a graph input is
            node_key = drawn_key(label, value, is_opaque, codecs)
            done.drawn.add(node)
        elif (
            type(impl) is Pick
            and (node_key is not None or node in env.picks)
            and not (is_opaque or remembered)
        ):  # keyed as an input is, by its content: the rest of the input does not count
            node_key = digest(value, codecs, f"the input {label!r} picked")
            if keyless is not None:
                anew.add(node)
        if is_opaque:
            opaque.add(node)
        elif remembered and node_key is not None and keeper is not None:
            if not per_item or node in memory.named:  # a name needs the whole list stored
                try:
                    data = encode(value, codecs, _where(label))
                except ValueConversionError as e:  # (a tensor subclass: no Opaque way out)
                    raise rows.not_stored(label, e, "cached or named") from None
                keeper.put(node_key, data, pinned=node in memory.pinned)
                value = in_decoded_order(value)  # (dicts in the order a hit gives them)
                if before is not None:  # what explain compares a later miss with
                    in_key = digest(tuple(in_keys))
                    note(keeper, label, impl, before, in_key, env.node_keys.context())
                    # (a frozen node's modules are put in eval mode around its forward)
                    if node not in memory.frozen and env.node_keys.parts(impl)[2] != before[2]:
                        warn_changed_itself(label, impl)
            if node in memory.named:
                keeper.name(memory.named[node], node_key)
        elif sub is None:
            check(value, codecs, _where(label))
        values[node], vkeys[node] = value, node_key
        if node_metrics:
            metrics[node] = node_metrics
            notify(watchers, Metrics(run.id, label, run.step, node_metrics))


def _run_sub(
    env: Env,
    sub: Program,
    node: str,
    impl: Any,
    inp: Any,
    ctx: Ctx,
    source: str | None,
    in_keys: Sequence[str | None],
    node_key: str | None,
    keyless: str | None,
    watch: Callable[[Forward, Any, Ctx], tuple[Any, bool]] | None,
) -> tuple[Any, bool]:
    """A subgraph node's keyed run (an ``Outcome``), through the runtime's wrap, and whether
    it drew random numbers (through ``watch``, the runtime's ``draws``; else False)."""
    sub_key = None
    if node_key is not None:
        sub_key = in_keys[0] if len(in_keys) == 1 else digest(tuple(in_keys))

    def forward(x: Any, ctx: Ctx) -> Done:  # (the wrap may change ctx.run: training off)
        o = sub.run_keyed(
            x,
            source is not None,
            sub_key,
            ctx.run,
            env.node_keys,
            env.keeper,
            env.watchers,
            env.prefix + node + "/",
            need_key=node_key is not None,
            keyless_from=keyless,
            explained=env.explained,  # (g.explain: the subgraph's cached nodes too)
        )
        return Done(o)

    call = env.wrap(node, impl, forward) if env.wrap is not None else forward
    if watch is None:
        return call(inp, ctx).value, False
    done, drew = watch(call, inp, ctx)
    return done.value, drew


def _recall(env: Env, node_key: str, inp: Any, device: str | None) -> tuple[Any] | None:
    """A whole-node hit, decoded and moved where the node would have put its output (its
    placement's device, else its input's); None on a miss. An entry that does not decode
    is a miss: it is discarded, so the node runs and writes it afresh."""
    keeper = env.keeper
    data = keeper.get(node_key) if keeper is not None else None
    if data is None:
        return None
    try:
        value = decode(data, env.codecs)
    except Exception:
        rows.discard(keeper, node_key)
        return None
    return (rows.place(value, device or rows.device_of(inp, env.codecs), env.codecs),)
