"""Running one slice of a distributed plan — on the caller's host, or on a worker.

The same loop serves both sides: the caller runs the slices placed on ``LOCAL`` with
live values, and a worker runs a ``Job`` whose values arrive encoded. It follows the
keyed path of ``execute.Program.run_keyed`` (the contract is the same), but reads and
writes values by slot — the id of the node that made them — so a slice can start and
end anywhere in the plan. Keys come from the caller: a key does not depend on where
it is computed, and computing it once there keeps it identical on every host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from .errors import CacheError, NodeError
from .memory import Memory, NodeKeys, key
from .node import Ctx, Done, Mapped, Run
from .topology import Topology
from .values import Opaque, check, decode, digest, encode
from .watchers import CacheHit, CacheMiss, Event, Metrics, NodeEnd, NodeStart, notify

if TYPE_CHECKING:
    from .codecs import Codec
    from .execute import Program
    from .keepers import Keeper
    from .shipping import Bundle
    from .transports import Job, Reply
    from .watchers import Watcher

__all__ = ["Env", "Values", "execute_job", "run_steps"]

Forward = Callable[[Any, Ctx], Any]
_EVENTS: dict[str, Any] = {
    e.__name__: e for e in (NodeStart, NodeEnd, CacheHit, CacheMiss, Metrics)
}


class Values(dict[str, Any]):
    """Node values by slot; a value that arrived encoded is decoded on first read."""

    def __init__(self, wire: Mapping[str, bytes], codecs: Sequence[Codec]) -> None:
        super().__init__()
        self.wire = wire
        self.codecs = codecs

    def __missing__(self, slot: str) -> Any:
        value = self[slot] = decode(self.wire[slot], self.codecs)
        return value


@dataclass
class Env:
    """What running a slice needs besides its values: one per host and run."""

    host: str
    impls: Mapping[str, Any]
    forward: Callable[[str, Any], Forward]  # node id, implementation -> its forward
    subprogram: Callable[[str], Program | None]
    parts: Callable[[str], tuple[str, str, str]]  # for cached mapped nodes
    memory: Memory
    codecs: Sequence[Codec]
    devices: Mapping[str, str]
    keeper: Keeper | None
    node_keys: NodeKeys  # keys inside subgraph nodes
    watchers: Sequence[Watcher]
    run: Run


def _where(node: str) -> str:
    return f"the output of node {node!r}"


def run_steps(
    env: Env,
    steps: Sequence[tuple[str, tuple[str, ...]]],
    x: Any,
    x_opaque: bool,
    x_key: str | None,
    values: dict[str, Any],
    opaque: set[str],
    keys: Mapping[str, str | None],
    metrics: dict[str, Any],
) -> None:
    """Run ``steps`` (node id, input slots), reading and adding to ``values`` and ``opaque``.

    ``keys`` holds the key of every node that needs one (remembered nodes and what feeds
    them). Raises what the nodes raise, with a note naming the node and host.
    """
    memory, codecs, run = env.memory, env.codecs, env.run
    watchers, keeper = env.watchers, env.keeper
    for node, inputs in steps:
        if not inputs:
            inp, in_keys = x, [x_key]
            source = "the graph input" if x_opaque else None
        else:
            got = [values[i] for i in inputs]
            inp = got[0] if len(got) == 1 else tuple(got)
            in_keys = [keys.get(i) for i in inputs]
            source = next((f"node {i!r}" for i in inputs if i in opaque), None)
        impl = env.impls[node]
        remembered = memory.remembers(node)
        node_key = keys.get(node)
        if remembered and source is not None:
            raise CacheError(
                f"node {node!r} is cached but its input from {source} is Opaque; Opaque values "
                f"cannot enter a key — return data (a detached tensor) from {source}, or stop "
                f"caching {node!r}"
            )
        if remembered and node_key is None:
            raise CacheError(
                f"node {node!r} is cached or named but has no key: a value upstream of it is "
                f"Opaque (the graph input) — pass data, or stop caching {node!r}"
            )
        mapped = isinstance(impl, Mapped) and node in memory.cached
        if node_key is not None and node in memory.cached and not mapped and keeper is not None:
            hit = keeper.get(node_key)
            if hit is not None:
                notify(watchers, CacheHit(run.id, node, node_key))
                values[node] = decode(hit, codecs)
                continue
            notify(watchers, CacheMiss(run.id, node, node_key))
        ctx = Ctx(node, env.devices.get(node), run)
        sub = env.subprogram(node)
        node_metrics = None
        notify(watchers, NodeStart(run.id, node, run.step))
        start = time.perf_counter()
        try:
            if sub is not None:
                sub_key = None
                if source is None and node_key is not None:
                    known = [k for k in in_keys if k is not None]
                    sub_key = known[0] if len(known) == 1 else digest(tuple(known))
                o = sub.run_keyed(
                    inp,
                    source is not None,
                    sub_key,
                    run,
                    env.node_keys,
                    keeper,
                    watchers,
                    node + "/",
                    need_key=node_key is not None,
                )
                value, is_opaque = o.value, o.opaque
                metrics.update({f"{node}/{k}": v for k, v in o.metrics.items()})
            elif mapped:
                value, is_opaque = _mapped(env, node, impl, inp, ctx), False
            else:
                done = env.forward(node, impl)(inp, ctx)
                if type(done) is not Done:
                    raise _not_done(node, impl, done)
                value, node_metrics = done
                is_opaque = type(value) is Opaque
                if is_opaque:
                    value = value.value
        except Exception as e:
            if hasattr(e, "add_note") and not isinstance(e, (NodeError, CacheError)):
                e.add_note(
                    f"raised by node {node!r} ({type(impl).__qualname__}) on host {env.host!r}"
                )
            raise
        notify(watchers, NodeEnd(run.id, node, run.step, time.perf_counter() - start))
        if is_opaque:
            if remembered:
                raise CacheError(
                    f"node {node!r} is cached or named but returned Opaque; Opaque values are "
                    f"never stored — return data (a detached tensor) or stop caching {node!r}"
                )
            opaque.add(node)
        elif remembered and node_key is not None and keeper is not None:
            if not mapped:
                data = encode(value, codecs, _where(node))
                keeper.put(node_key, data, pinned=node in memory.pinned)
            if node in memory.named:
                keeper.name(memory.named[node], node_key)
        elif sub is None:
            check(value, codecs, _where(node))
        values[node] = value
        if node_metrics:
            metrics[node] = node_metrics
            notify(watchers, Metrics(run.id, node, run.step, node_metrics))


def _mapped(env: Env, node: str, impl: Mapped, items: Any, ctx: Ctx) -> list[Any]:
    """A cached mapped node: each item keyed by its own content; only misses computed."""
    if type(items) is not list and type(items) is not tuple:
        raise NodeError(f"mapped node {node!r} received a {type(items).__name__}; it takes a list")
    parts, codecs, keeper, run = env.parts(node), env.codecs, env.keeper, env.run
    inner = env.forward(node, impl.inner)
    out = []
    for i, item in enumerate(items):
        item_key = key(*parts, [digest(item, codecs, f"item {i} of the input of {node!r}")])
        hit = keeper.get(item_key) if keeper is not None else None
        if hit is not None:
            notify(env.watchers, CacheHit(run.id, f"{node}[{i}]", item_key))
            out.append(decode(hit, codecs))
            continue
        notify(env.watchers, CacheMiss(run.id, f"{node}[{i}]", item_key))
        done = inner(item, ctx)
        if type(done) is not Done:
            raise _not_done(node, impl.inner, done)
        if type(done.value) is Opaque:
            raise CacheError(
                f"cached mapped node {node!r} returned Opaque for item {i}; "
                "cached items must be data — return data or stop caching it"
            )
        if keeper is not None:
            data = encode(done.value, codecs, f"item {i} of {_where(node)}")
            keeper.put(item_key, data, pinned=node in env.memory.pinned)
        out.append(done.value)
    return out


def _not_done(node: str, impl: Any, got: Any) -> NodeError:
    return NodeError(
        f"node {node!r} ({type(impl).__qualname__}) returned {type(got).__name__} instead of "
        "Done — end forward with `return Done(value)`"
    )


# -- the worker side --------------------------------------------------------------------


class _Collect:
    """Watcher events of a slice, kept as data to send back to the caller's watchers."""

    def __init__(self) -> None:
        self.events: list[list[Any]] = []

    def on_event(self, event: Event) -> None:
        row: list[Any] = [type(event).__name__]
        for f in fields(event)[1:]:  # run_id: the caller's own
            v = getattr(event, f.name)
            row.append(dict(v) if isinstance(v, Mapping) else v)
        self.events.append(row)


def replay(
    events: bytes, codecs: Sequence[Codec], run_id: str, watchers: Sequence[Watcher]
) -> None:
    """Tell ``watchers`` the events a worker sent back."""
    for name, *rest in decode(events, codecs):
        notify(watchers, _EVENTS[name](run_id, *rest))


def execute_job(job: Job, bundle: Bundle, keeper: Keeper) -> Reply:
    """Run a slice from its ``Job`` with the worker's code and keeper; encode the outputs."""
    from .graph import Graph

    codecs = bundle.codecs
    impls = bundle.impls
    topology = Topology.from_json(job["topology"])
    steps = [(n, topology.predecessors(n)) for n in job["nodes"]]
    values = Values(job["inputs"], codecs)
    x = decode(job["input"], codecs) if job["input"] is not None else None
    injected = decode(job["values"], codecs) if job["values"] is not None else {}
    collect = _Collect()
    env = Env(
        host=job["host"],
        impls=impls,
        forward=lambda node, impl: impl.forward,
        subprogram=lambda node: impls[node].program() if isinstance(impls[node], Graph) else None,
        parts=lambda node: (job["parts"][node][0], job["parts"][node][1], job["parts"][node][2]),
        memory=Memory(
            cached=frozenset(job["cached"]), named=job["named"], pinned=frozenset(job["pinned"])
        ),
        codecs=codecs,
        devices=job["devices"],
        keeper=keeper,
        node_keys=NodeKeys(codecs),
        watchers=[collect] if job["watched"] else [],
        run=Run(job["run_id"], job["step"], job["training"], injected),
    )
    opaque: set[str] = set()
    metrics: dict[str, Any] = {}
    keys: Mapping[str, str | None] = job["keys"]
    run_steps(env, steps, x, False, job["input_key"], values, opaque, keys, metrics)
    outputs = {}
    for slot in job["outputs"]:
        if slot not in opaque:
            outputs[slot] = encode(values[slot], codecs, _where(slot))
    return {
        "outputs": outputs,
        "opaque": [s for s in job["outputs"] if s in opaque],
        "metrics": encode(metrics, codecs, f"the metrics of {job['name']}"),
        "events": encode(collect.events, codecs, f"the watcher events of {job['name']}"),
    }
