"""Running one slice of a distributed plan on a worker, from its ``Job``.

A slice runs through ``keyed.walk``, the loop of the single-process keyed path, on
both sides: the caller walks the slices placed on ``LOCAL`` with live values, and a
worker walks a ``Job`` whose values arrive encoded (``Values``). Values are read and
written by slot — the id of the node that made them — so a slice can start and end
anywhere in the plan. Keys come from the caller: a key does not depend on where it is
computed, and computing it once there keeps it identical on every host (the worker
may not be able to read the user's source that a key's identity is made of).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from .errors import ValueConversionError, add_note
from .keyed import Env, Walk, walk
from .memory import Memory, NodeKeys
from .node import Run, injected_values
from .topology import Topology
from .values import decode, encode
from .watchers import (
    CacheHit,
    CacheMiss,
    CacheRows,
    Event,
    Metrics,
    NodeEnd,
    NodeStart,
    notify,
)

if TYPE_CHECKING:
    from .codecs import Codec
    from .keepers import Keeper
    from .shipping import Bundle
    from .transports import Job, Reply
    from .watchers import Watcher

__all__ = ["Values", "execute_job", "note_leaving", "replay"]

_EVENTS: dict[str, Any] = {
    e.__name__: e for e in (NodeStart, NodeEnd, CacheHit, CacheMiss, CacheRows, Metrics)
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


def note_leaving(e: ValueConversionError, outputs: Sequence[str], host: str) -> None:
    """Add to ``e``, refusing the output of a node whose value leaves ``host``, that Opaque
    (which its message may offer) is no way out there."""
    for slot in outputs:
        if str(e).startswith(f"the output of node {slot!r}:"):
            add_note(
                e,
                f"(node {slot!r} runs on host {host!r}, and its output goes to another host: "
                "it must be data — an Opaque value cannot leave its process; a tensor: detach "
                f"it, or freeze {slot!r})",
            )
            return


def replay(
    events: bytes, codecs: Sequence[Codec], run_id: str, watchers: Sequence[Watcher]
) -> None:
    """Tell ``watchers`` the events a worker sent back."""
    for name, *rest in decode(events, codecs):
        notify(watchers, _EVENTS[name](run_id, *rest))


def _forward(node: str, impl: Any, wrap: Any) -> Any:
    """The forward a worker runs for ``node``: its own, or the caller's runtime ``wrap`` of it
    (a frozen node's); a subgraph's is its program's (its rows, cached per example, too),
    wrapped as below."""
    from .graph import Graph

    if not isinstance(impl, Graph):
        return wrap or impl.forward
    return _rewrap(wrap, impl.program().as_forward())


def _rewrap(wrap: Any, forward: Any) -> Any:
    """``forward`` (a subgraph's run) in a copy of the wrap the caller sent without it."""
    if wrap is None:
        return forward
    wrap = copy.copy(wrap)
    wrap.forward = forward
    return wrap


def execute_job(job: Job, bundle: Bundle, keeper: Keeper) -> Reply:
    """Run a slice from its ``Job`` with the worker's code and keeper; encode the outputs."""
    from .graph import Graph

    codecs = bundle.codecs
    impls = bundle.impls
    topology = Topology.from_json(job["topology"])
    steps = [(n, topology.predecessors(n)) for n in job["nodes"]]
    x = decode(job["input"], codecs) if job["input"] is not None else None
    injected = injected_values(decode(job["values"], codecs) if job["values"] is not None else None)
    collect = _Collect()
    keys, parts = job["keys"], job["parts"]
    env = Env(
        impls=impls,
        forward=lambda node, impl: _forward(node, impl, bundle.forwards.get(node)),
        subprogram=lambda node: impls[node].program() if isinstance(impls[node], Graph) else None,
        key=lambda node, impl, in_keys: keys.get(node),  # the caller's, never recomputed here
        parts=lambda node: (parts[node][0], parts[node][1], parts[node][2]),
        memory=Memory(
            cached=frozenset(job["cached"]),
            named=job["named"],
            pinned=frozenset(job["pinned"]),
            per_example=frozenset(job["per_example"]),
        ),
        codecs=codecs,
        devices=job["devices"],
        keeper=keeper,
        node_keys=NodeKeys(codecs),
        watchers=[collect] if job["watched"] else [],
        run=Run(job["run_id"], job["step"], job["training"], injected),
        host=job["host"],
        wrap=lambda node, impl, forward: _rewrap(bundle.forwards.get(node), forward),
    )
    done = Walk(Values(job["inputs"], codecs), dict(keys))
    # An Opaque graph input never reaches a worker; without an input key, it was Opaque
    # (or nothing needs a key), and no node below it has one.
    keyless = "the graph input" if job["input_key"] is None else None
    try:
        walk(env, steps, x, False, job["input_key"], done, keyless)
    except ValueConversionError as e:
        note_leaving(e, job["outputs"], job["host"])
        raise
    outputs = {}
    for slot in job["outputs"]:
        if slot not in done.opaque:
            try:
                outputs[slot] = encode(done.values[slot], codecs, f"the output of node {slot!r}")
            except ValueConversionError as e:
                note_leaving(e, [slot], job["host"])
                raise
    return {
        "outputs": outputs,
        "opaque": [s for s in job["outputs"] if s in done.opaque],
        "metrics": encode(done.metrics, codecs, f"the metrics of {job['name']}"),
        "events": encode(collect.events, codecs, f"the watcher events of {job['name']}"),
    }
