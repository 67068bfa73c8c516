"""Running a graph whose nodes are placed on several hosts.

The caller walks the distributed plan: slices on ``LOCAL`` run here, with live values;
every other slice goes to the transport of its host as a ``Job`` of plain values.
Values between slices pass through the caller — encoded once, never pickled — so a
worker keeps nothing between slices and any worker of an executor can take any slice.
An ``Opaque`` value that would leave its process raises ``CrossingError`` naming the
edge and the hosts.

This path is taken only when the placement names another host; a graph on one host
runs by ``Program.run_fast`` / ``run_keyed`` untouched.
"""

from __future__ import annotations

import copy
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from . import identity
from .errors import TransportError, ValueConversionError
from .execute import Outcome
from .host_checks import check_transport, checked, crossing
from .keyed import Env, Walk, keyed_impl, recipe_key, walk
from .nested_keepers import made_keeper, warn_unused_keepers
from .node import Mapped, Node, Run
from .placement import LOCAL
from .plan import DistributedPlan, distribute
from .shipping import pack_code
from .slices import Values, note_leaving, replay
from .topology import Topology
from .values import decode, digest, encode
from .watchers import RunEnd, RunStart, notify

if TYPE_CHECKING:
    from .execute import Program
    from .graph import Graph
    from .memory import NodeKeys
    from .transports import Job, Transport

__all__ = ["run_across"]


@dataclass
class _Prepared:
    """What a program's distributed runs share; built once per program."""

    dplan: DistributedPlan
    steps: list[list[tuple[str, tuple[str, ...]]]]
    jobs: list[dict[str, Any]]  # the fixed fields of each slice's Job
    readers: dict[str, list[tuple[str | None, str]]]  # node -> (reader or None for output, host)
    code: dict[int, tuple[Any, str, bytes]] = field(default_factory=dict)  # token, digest, bytes
    lock: threading.Lock = field(default_factory=threading.Lock)


_prepared: weakref.WeakKeyDictionary[Program, _Prepared] = weakref.WeakKeyDictionary()


def _prepare(program: Program) -> _Prepared:
    prep = _prepared.get(program)
    if prep is not None:
        return prep
    plan, memory = program.plan, program.memory
    dplan = distribute(plan)
    slices = dplan.slices
    home = {s.node: sl.host for sl in slices for s in sl.steps}
    readers: dict[str, list[tuple[str | None, str]]] = {}
    for s in plan.steps:
        for i in s.inputs:
            readers.setdefault(i, []).append((s.node, home[s.node]))
    for o in plan.output:
        readers.setdefault(o, []).append((None, LOCAL))
    steps, jobs = [], []
    for index, sl in enumerate(slices):
        steps.append([(s.node, s.inputs) for s in sl.steps])
        nodes = sl.nodes
        outside = tuple(i for i in sl.inputs if i is not None)
        topology = Topology(
            outside + nodes,
            tuple(e for e in plan.topology.edges if e[1] in nodes),
            {n: t for n, t in plan.topology.subgraphs.items() if n in nodes},
        )
        jobs.append(
            {
                "name": f"slice {index + 1} on host {sl.host!r} ({', '.join(nodes)})",
                "host": sl.host,
                "topology": topology.to_json(),
                "nodes": list(nodes),
                "outputs": list(sl.outputs),
                "cached": [n for n in nodes if n in memory.cached],
                "named": {n: memory.named[n] for n in nodes if n in memory.named},
                "pinned": [n for n in nodes if n in memory.pinned],
                "per_example": [n for n in nodes if n in memory.per_example],
                "devices": {n: d for n in nodes if (d := plan.placement.device(n)) is not None},
            }
        )
    prep = _prepared[program] = _Prepared(dplan, steps, jobs, readers)
    return prep


def _keys(
    program: Program,
    node_keys: NodeKeys,
    x_key: str | None,
    ran: Mapping[str, str | None] | None = None,
) -> dict[str, str | None]:
    """The key of every node that needs one, computed here so it is the same on every host
    (those of the nodes that ``ran`` already: theirs)."""
    keys: dict[str, str | None] = {}
    if not program.keyed:
        return keys
    need = program._needs_key
    for s in program.plan.steps:
        if ran is not None and s.node in ran:
            keys[s.node] = ran[s.node]
        elif s.node in need:
            prepare = program._prepares.get(s.node)
            if prepare is not None:  # (a frozen node: keyed in eval mode, as a local run keys it)
                prepare()
            # no key downstream of an Opaque graph input (a remembered node then refuses)
            preds = [keys.get(i) for i in s.inputs] if s.inputs else [x_key]
            keys[s.node] = recipe_key(node_keys, program.catalog[s.node], s.node, preds)
    return keys


def _code(
    prep: _Prepared, index: int, program: Program, keys: NodeKeys, name: str
) -> tuple[str, bytes]:
    """The code bytes of a slice and their digest, pickled again only when a node changed."""
    nodes = prep.jobs[index]["nodes"]
    impls = [program.catalog[n] for n in nodes]
    codecs = program.codecs
    # The runtime's wraps that set how a node runs (a frozen node: eval mode, no grad) travel
    # with it, its modules put in that mode first: a worker runs the node as this host would.
    forwards = {}
    for n, impl in zip(nodes, impls, strict=True):
        prepare = program._prepares.get(n)
        if prepare is not None:
            prepare()
            wrap = prepare.__self__  # type: ignore[attr-defined]
            if not isinstance(impl, Node):  # a subgraph: the worker wraps its own program's
                wrap = copy.copy(wrap)
                wrap.forward = None
            forwards[n] = wrap
    # A node's key parts tell whether it changed — its code, the globals it reads, its
    # state (new weights) — as its key sees them; subgraphs always re-pickle.
    token = _token(impls, keys) if all(isinstance(i, Node) for i in impls) else None
    with prep.lock:
        known = prep.code.get(index)
        if known is not None and token is not None and known[0] == token:
            return known[1], known[2]
    data = pack_code(dict(zip(nodes, impls, strict=True)), codecs, name, forwards)
    code_digest = blake3(data).hexdigest()
    with prep.lock:
        prep.code[index] = (token, code_digest, data)
    return code_digest, data


def _token(impls: Sequence[Any], keys: NodeKeys) -> tuple[tuple[str, str, str], ...]:
    """The nodes' key parts, to tell whether their code must be sent again; read quietly: what
    enters a *key* by type alone is warned of where a key is made, and these nodes may not
    be cached at all (a tokenizer a library made, held by a node that is not)."""
    with identity.quietly():
        return tuple(keys.parts(keyed_impl(i)) for i in impls)


def run_across(
    graph: Graph,
    program: Program,
    x: Any,
    x_opaque: bool,
    run: Run,
    transports: Mapping[str, Transport] | None,
) -> Outcome:
    """Run a program whose placement names other hosts; slices go to ``transports``.

    Raises:
        TransportError: a host has no transport (the message names it and the fix), or a
            slice could not be carried or its worker was lost.
        CrossingError: an Opaque value would have to change host.
    """
    prep = _prepare(program)
    given = transports is not None
    transports = transports or {}
    if not isinstance(transports, Mapping):
        raise TypeError(
            f"transports={transports!r:.60} is a {type(transports).__qualname__}; it maps each "
            "host name to its transport: g.forward(x, transports={'box': InProcess()})"
        )
    for host in prep.dplan.hosts:
        if host != LOCAL and host not in transports:
            nodes = [n for sl in prep.dplan.slices if sl.host == host for n in sl.nodes]
            # (no transports at all: also how st.module(g) and the Trainer run a graph)
            alone = (
                ""
                if given
                else ". st.module(g) and the Trainer take no transports (they run a graph in "
                f"one process): move it back with g.place({nodes[0]!r}, host='local'), or "
                "train by hand through g.forward(x, training=True, transports=...) "
                "(docs/distributed.md, 'Training beside a node on another host')"
            )
            raise TransportError(
                f"node(s) {', '.join(map(repr, nodes))} are placed on host {host!r}, but no "
                f"transport was given for it; pass one: g.forward(x, transports={{{host!r}: "
                f"ExecutorTransport(executor)}}) — or transports.InProcess() to try it here{alone}"
            )
        if host != LOCAL:
            check_transport(host, transports[host])
    keeper = graph.keeper
    if keeper is None and program.keyed:
        keeper = made_keeper(graph)
    if program.keyed:  # (a subgraph node on another host keeps its entries in its worker's)
        away = frozenset(n for n, h in graph.placement.hosts.items() if h != LOCAL)
        warn_unused_keepers(graph, program, keeper, away)
    codecs = program.codecs
    x_key = None if x_opaque or not program.keyed else digest(x, codecs, "the graph input")
    keys = planned = _keys(program, graph.keys, x_key)
    need, preds = program._needs_key, program.topology.predecessors
    watchers = graph.watchers
    notify(watchers, RunStart(run.id, len(program.plan)))
    start = time.perf_counter()
    wire: dict[str, bytes] = {}
    done = Walk(Values(wire, codecs), dict(keys))
    values, opaque, metrics = done.values, done.opaque, done.metrics
    ran: set[str] = set()  # the nodes of the slices run so far

    def key(node: str, impl: Any, in_keys: Sequence[str | None]) -> str | None:
        """The key computed before the run; made anew below a node on this host that drew
        random numbers, keyed by its output (``drawn.py``; another host's are not watched)."""
        moved = done.drawn and node in need
        if moved and list(in_keys) != ([planned.get(i) for i in preds(node)] or [x_key]):
            return recipe_key(graph.keys, impl, node, in_keys)
        return planned.get(node)

    env = Env(
        impls=program.catalog,
        forward=program.forward_of,  # the runtime's wrap applies here
        subprogram=program.subprograms.get,
        key=key,
        parts=lambda node: graph.keys.parts(keyed_impl(program.catalog[node])),
        memory=program.memory,
        codecs=codecs,
        devices=program.plan.placement.devices,
        keeper=keeper,
        node_keys=graph.keys,
        watchers=watchers,
        run=run,
        host=LOCAL,
        wrap=program.wrap,
        draws=getattr(program.wrap, "draws", None),
        watched=program.watched,
    )
    x_data: bytes | None = None  # the graph input, encoded once if a remote slice reads it
    for index, sl in enumerate(prep.dplan.slices):
        if sl.host == LOCAL:
            try:
                walk(env, prep.steps[index], x, x_opaque, x_key, done)
            except ValueConversionError as e:
                leave = [o for o in sl.outputs if any(h != LOCAL for _, h in prep.readers[o])]
                note_leaving(e, leave, LOCAL)
                raise
            ran.update(sl.nodes)
            continue
        inputs = {}
        for slot in sl.inputs:
            if slot is None:
                if x_opaque:
                    readers = [(s.node, sl.host) for s in sl.steps if not s.inputs]
                    raise crossing(None, LOCAL, readers)
                if x_data is None:
                    x_data = encode(x, codecs, "the graph input")
                continue
            if slot in opaque:
                readers = [(r, h) for r, h in prep.readers[slot] if r in sl.nodes]
                raise crossing(slot, LOCAL, readers)
            if slot not in wire:
                try:
                    wire[slot] = encode(values[slot], codecs, f"the output of node {slot!r}")
                except ValueConversionError as e:
                    note_leaving(e, [slot], LOCAL)
                    raise
            inputs[slot] = wire[slot]
        x_in = x_data if None in sl.inputs else None
        if done.drawn:  # below a node that drew, keys anew: a worker computes none
            keys = _keys(program, graph.keys, x_key, {n: done.keys.get(n) for n in ran})
            done.keys.update((n, keys.get(n)) for n in sl.nodes)
        ran.update(sl.nodes)
        job = _job(prep, index, program, graph, inputs, x_in, x_key, keys, run)
        job["code"], code = _code(prep, index, program, graph.keys, job["name"])
        transport = transports[sl.host]
        reply = checked(transport.run(job, code), transport, job)
        if reply["opaque"]:
            slot = reply["opaque"][0]
            later = [(r, h) for r, h in prep.readers[slot] if r is None or r not in sl.nodes]
            raise crossing(slot, sl.host, later)
        wire.update(reply["outputs"])
        try:
            metrics.update(decode(reply["metrics"], codecs))
        except ValueError as e:
            raise TransportError(
                f"{job['name']}: {type(transport).__qualname__}.run replied with 'metrics' "
                f"that do not decode ({e}); a transport returns them as serve() encodes them"
            ) from e
        if watchers:
            replay(reply["events"], codecs, run.id, watchers)
    notify(watchers, RunEnd(run.id, time.perf_counter() - start))
    return program.outcome(done)


def _job(
    prep: _Prepared,
    index: int,
    program: Program,
    graph: Graph,
    inputs: dict[str, bytes],
    x_data: bytes | None,
    x_key: str | None,
    keys: Mapping[str, str | None],
    run: Run,
) -> Job:
    """The Job of a remote slice: its fixed fields, and this run's values and keys."""
    fixed = prep.jobs[index]
    catalog, memory = program.catalog, program.memory
    nodes: list[str] = fixed["nodes"]
    injected = None
    if run.values:
        where = f"the injected values (values=...) sent to host {fixed['host']!r}"
        injected = encode(dict(run.values), program.codecs, where)
    job: Job = {
        **fixed,  # type: ignore[typeddict-item]
        "inputs": inputs,
        "input": x_data,
        "input_key": x_key,
        "keys": {n: k for n in [*nodes, *inputs] if (k := keys.get(n)) is not None},
        "parts": {  # items are keyed by the inner node, rows by the node: its parts
            n: list(graph.keys.parts(keyed_impl(catalog[n])))
            for n in nodes
            if n in memory.per_example or (n in memory.cached and isinstance(catalog[n], Mapped))
        },
        "run_id": run.id,
        "step": run.step,
        "training": run.training,
        "values": injected,
        "watched": bool(graph.watchers),
        "code": "",
    }
    return job
