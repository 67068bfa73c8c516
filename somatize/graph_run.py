"""How a ``Graph`` runs: its program, built from its subgraphs' programs (each checked
first), and a keyed run — the input's key, the keeper made on first need, the watchers
told of the run, the keys of pinned nodes' entries logged. ``Graph.program`` and
``Graph.run`` call these; a run with nothing keyed and nothing watching stays in
``Graph.run`` (``Program.run_fast``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .errors import EmptyGraphError, GraphError
from .execute import Outcome, Program
from .nested_keepers import made_keeper, warn_unused_keepers
from .placement import LOCAL
from .values import digest
from .watchers import RunEnd, RunStart, notify

if TYPE_CHECKING:
    from .graph import Graph
    from .node import Run

__all__ = ["build_program", "run_keyed"]


def build_program(g: Graph) -> Program:
    """``g``'s program, compiled with its subgraphs' programs.

    Raises:
        EmptyGraphError: a subgraph node has no nodes.
        GraphError: a subgraph node has inner nodes placed on other hosts.
    """
    subs = {}
    for n, sub in g._subgraphs().items():
        if not len(sub):
            raise EmptyGraphError(
                f"node {n!r} is a subgraph with no nodes; add one to it "
                "(sub.node(id, impl)) or leave it out of this graph"
            )
        if sub.placement.multi_host:  # (run here, it would run them all here)
            placed = [k for k, h in sub.placement.hosts.items() if h != LOCAL]
            raise GraphError(
                f"node {n!r} is a subgraph with inner nodes placed on other hosts; a "
                f"subgraph moves as one unit — place the subgraph node itself "
                f"(g.place({n!r}, host=...)) and put its inner nodes back on 'local' "
                f"(sub.place({placed[0]!r}, host='local'))"
            )
        subs[n] = sub.program()
    placements = {n: sub.placement for n, sub in g._subgraphs().items()}
    return Program.compiled(
        g.topology, g.placement, placements, g.catalog, g.memory, g.codecs, subs, g.wrap
    )


def run_keyed(g: Graph, program: Program, x: Any, opaque: bool, run: Run) -> Outcome:
    """One run of ``g`` on this host that reads or writes the keeper, or is watched."""
    keeper = g.keeper
    if keeper is None and program.keyed:
        keeper = made_keeper(g)
    if program.keyed:
        warn_unused_keepers(g, program, keeper)
    x_key = None if opaque or not program.input_keyed else digest(x, g.codecs, "the graph input")
    if g.watchers:
        notify(g.watchers, RunStart(run.id, len(program.plan)))
    start = time.perf_counter()
    watchers = g.watchers
    if g.memory.pinned:  # the keys of pinned nodes' entries, for pin(node, False)
        watchers = [*watchers, g._pins.watching(g.memory.pinned)]
    outcome = program.run_keyed(x, opaque, x_key, run, g.keys, keeper, watchers)
    if g.watchers:
        notify(g.watchers, RunEnd(run.id, time.perf_counter() - start))
    return outcome
