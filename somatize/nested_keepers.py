"""A nested graph's own keeper is not used: said once, where the outer graph runs.

Every node's entries, a subgraph's nodes' too, go to the keeper of the graph that is run
(the outer one): a keeper given to the inner graph, ``Graph.somatize(a >> b, keeper=k)``,
serves that graph run on its own, and is passed over once it is nested. Using it there
instead would split one run's entries over two keepers, which ``g.explain``, pins, the
cache counts of a fit and ``somatize cache`` each read one of — so the outer graph's keeper
stays the one, and a subgraph whose remembered nodes would have used their own keeper is
warned of (naming the subgraph, its keeper, those nodes and the fix) the first time the
outer graph runs with it. A keeper made on first need (a subgraph run once on its own
before) was not chosen, and is not warned of; nor is the outer graph's own keeper given to
the subgraph too (it is the one used).

Not a warning at ``g.node`` time: what the subgraph caches and which keeper the outer graph
has may both be set after it is nested (``g.keeper = ...``, ``sub.cache(...)``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from .stack import outside

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["made_keeper", "warn_unused_keepers"]


def made_keeper(g: Graph) -> Any:
    """The ``MemoryKeeper`` a graph without a keeper is given on first need, marked as made
    (not chosen): nested later, it is not warned of."""
    from .keepers import MemoryKeeper

    g.keeper = g._made_keeper = MemoryKeeper()
    return g.keeper


def _remembered(g: Graph, prefix: str) -> list[str]:
    """The nodes whose entries go to a keeper (cached or named), at any depth, as labels."""
    memory = g.memory
    found = [prefix + n for n in g.nodes() if memory.remembers(n)]
    for sub_id, sub in g._subgraphs().items():
        found += _remembered(sub, f"{prefix}{sub_id}/")
    return found


def _unused(g: Graph, root_keeper: Any, prefix: str, skip: frozenset[str]) -> list[Any]:
    """(label, subgraph, nodes) for each subgraph at any depth whose own keeper, chosen by
    the user, would have held nodes that go to ``root_keeper`` instead."""
    out: list[Any] = []
    for sub_id, sub in g._subgraphs().items():
        if not prefix and sub_id in skip:
            continue
        label = prefix + sub_id
        own = sub.keeper
        if own is not None and own is not root_keeper and own is not sub._made_keeper:
            nodes = _remembered(sub, label + "/")
            if nodes:
                out.append((label, sub, nodes))
        out += _unused(sub, root_keeper, label + "/", frozenset())
    return out


def warn_unused_keepers(
    g: Graph, program: Any, keeper: Any, skip: frozenset[str] = frozenset()
) -> None:
    """Warn of each subgraph of ``g`` (at any depth) whose own keeper is passed over,
    checked once per program and keeper (the walk is skipped on every later run).

    Args:
        keeper: the keeper ``g`` runs with (made for it on first need, or none when
            nothing is remembered).
        skip: subgraph nodes placed on other hosts (a worker's keeper serves them).
    """
    checked = g._keepers_checked
    if checked is not None and checked[0] is program and checked[1] is keeper:
        return
    g._keepers_checked = (program, keeper)
    if not g._subgraphs():
        return
    for label, sub, nodes in _unused(g, keeper, "", skip):
        said = (label, id(sub.keeper), id(keeper))
        if said in g._keepers_said:
            continue
        g._keepers_said.add(said)
        where = "".join(f"[{p!r}]" for p in label.split("/"))
        theirs = (
            "the outer graph's keeper (a MemoryKeeper made for it, as it was given none)"
            if keeper is g._made_keeper
            else f"the outer graph's keeper ({keeper!r})"
        )
        many = len(nodes) > 1
        warnings.warn(
            f"subgraph {label!r} has its own keeper, {sub.keeper!r}, which is not used once "
            f"it is nested: its remembered node{'s' * many} {', '.join(map(repr, nodes))} "
            f"keep{'' if many else 's'} {'their' if many else 'its'} entries in {theirs}, "
            f"never in "
            f"{sub.keeper!r}. Give that keeper to the outer graph, "
            f"Graph.somatize(..., keeper=k) or g.keeper = g{where}.keeper (a keeper given "
            f"to both is used); or, if the outer graph's keeper is meant, take it off the "
            f"subgraph: g{where}.keeper = None",
            UserWarning,
            stacklevel=outside(),
        )
