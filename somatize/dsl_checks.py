"""The checks of a ``>>`` / ``|`` expression's wiring (``dsl.build`` runs them).

One instance written twice is one node: fine where the expression shares it
(``(enc >> a) | (enc >> b)``), refused where that would loop, give an edge twice or make a
fork give one output twice. And the graph's input goes to its roots and its outputs are
its sinks, so a branch that begins at a fed node or ends at a feeding one is refused, not
dropped. Each error names the node and the fix.
"""

from __future__ import annotations

from .errors import CycleError, GraphError

__all__ = [
    "FIX",
    "SHARE",
    "check_ends",
    "check_repeats",
    "check_starts",
    "ends_twice",
    "side_by_side",
]


def _linked(ids: list[str], edges: list[tuple[str, str]], end: int) -> tuple[str, list[str]]:
    """The first of ``ids`` (an expression's outer starts or ends, more than one) with
    an edge at ``end`` (1: fed by a node, 0: feeding one), and those nodes; ("", [])."""
    if len(ids) < 2:
        return "", []  # (one start is a root, one end a sink)
    linked: dict[str, list[str]] = {}
    for edge in edges:
        linked.setdefault(edge[end], []).append(edge[1 - end])
    nid = next((n for n in ids if n in linked), "")
    return nid, linked.get(nid, [])


def check_starts(starts: list[str], edges: list[tuple[str, str]]) -> None:
    """The graph's input goes to its roots (the nodes nothing feeds), so a node beginning a
    branch of the expression that another node also feeds (``(a >> n) | n``) would not
    receive it: refused, not dropped.

    Raises:
        GraphError: naming the node, what feeds it and the fix.
    """
    nid, fed_by = _linked(starts, edges, 1)
    if nid:
        raise GraphError(
            f"node {nid!r} begins a branch of the expression but is also fed by "
            f"{', '.join(map(repr, fed_by))}, and the graph's input goes to its roots "
            f"(the nodes nothing feeds): that branch would not receive it. Begin it with "
            f"a node of its own (an identity node), or leave the branch out"
        )


def check_ends(ends: list[str], edges: list[tuple[str, str]]) -> None:
    """A graph's outputs are its sinks, so an end of the expression that also feeds a node
    (``(enc >> a) | enc``: ``enc`` feeds ``a``) would not be returned: refused, not dropped.

    Raises:
        GraphError: naming the end, what it feeds and the fix.
    """
    nid, feeds = _linked(ends, edges, 0)
    if nid:
        raise GraphError(
            f"node {nid!r} ends a branch of the expression but also feeds "
            f"{', '.join(map(repr, feeds))}, and a graph's outputs are its sinks "
            f"(the nodes nothing follows): its value would not be returned. To return it, "
            f"end that branch with a node of its own (an identity node, forward returning "
            f"Done(Opaque(x))); or leave the branch out"
        )


FIX = (
    "use two instances for two nodes (Inc() >> Inc()), or give the instance two ids "
    "(n.with_id('a') and n.with_id('b')) for two nodes sharing its weights"
)

#: How two nodes share one set of weights (a siamese encoder applied to two inputs).
SHARE = (
    "to apply one set of weights to two inputs (a siamese encoder), give the instance an "
    "id per use, enc.with_id('left') and enc.with_id('right'): two nodes, one set of "
    "parameters, its gradient the sum of both uses"
)


def _twice(ids: list[str]) -> set[str]:
    """The ids that ``ids`` holds more than once."""
    seen: set[str] = set()
    twice = set()
    for n in ids:
        if n in seen:
            twice.add(n)
        seen.add(n)
    return twice


def side_by_side(srcs: list[str], sinks: list[str]) -> None:
    """``x | x``: one instance written twice side by side, beginning and ending two branches.

    Raises:
        GraphError: naming the node.
    """
    both = _twice(srcs) & _twice(sinks) if len(srcs) > 1 else set()
    if both:
        nid = min(both)
        raise GraphError(
            f"node {nid!r} is written twice side by side (x | x), and one instance "
            f"written twice is one node: the fork would give its output twice; {FIX}"
        )


def ends_twice(sinks: list[str], following: list[str]) -> None:
    """``((a >> c) | (b >> c)) >> d``: one node ends two branches of the fork ``d`` follows.

    Raises:
        GraphError: naming the node and what follows.
    """
    twice = _twice(sinks) if len(sinks) > 1 else set()
    if twice:
        nid = min(twice)
        raise GraphError(
            f"node {nid!r} ends two branches of a fork, and one instance written twice is "
            f"one node: {following[0]!r} after the fork would take its output twice; join "
            f"the branches before it instead, ((a | b) >> {nid} >> ...) — or, {SHARE}"
        )


def check_repeats(written: list[str], edges: list[tuple[str, str]]) -> None:
    """An instance written twice is one node: fine where the expression shares it
    (``(enc >> a) | (enc >> b)``), an error where that makes a loop, a cycle or an edge
    given twice — said so, instead of the bare cycle the graph would report. ``written``:
    the node id of each reference, in written order (an id twice: one node written twice).

    Raises:
        CycleError: the repeated instance feeds itself (``n >> n``, ``n >> m >> n``).
        GraphError: it is an input of one node twice (``a >> (b | b)``).
    """
    repeated = _twice(written)
    if not repeated:
        return
    fix = FIX
    after: dict[str, set[str]] = {}
    for a, b in edges:
        if b in after.setdefault(a, set()):
            twice = b if b in repeated else a
            raise GraphError(
                f"node {twice!r} is written twice side by side (x | x), and one instance "
                f"written twice is one node, so the edge {a!r} -> {b!r} would be given twice; "
                f"{fix}"
            )
        after[a].add(b)
    for nid in sorted(repeated):
        todo, reached = list(after.get(nid, ())), set()
        while todo:
            n = todo.pop()
            if n == nid:
                raise CycleError(
                    f"node {nid!r} is written twice in the expression, and one instance "
                    f"written twice is one node: its output would feed itself; {fix}"
                )
            if n not in reached:
                reached.add(n)
                todo.extend(after.get(n, ()))
