"""Rendering a graph: Mermaid for pictures, plain text for terminals and logs.

Memory marks (frozen, cached, named, pinned) are shown on each node; a subgraph
is drawn nested inside its node; with several hosts, each host is a cluster and
every value that crosses hosts is marked (``<- enc (box -> local)``, a dashed edge).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .placement import LOCAL

if TYPE_CHECKING:
    from .graph import Graph
    from .plan import Plan

__all__ = ["to_mermaid", "to_text"]


def _kind(impl: Any) -> str:
    from .graph import Graph
    from .node import Mapped
    from .pick import Pick

    if isinstance(impl, Graph):
        return "Graph"
    if isinstance(impl, Mapped):
        return f"{type(impl.inner).__qualname__}.mapped()"
    if type(impl) is Pick:  # which input it takes: Pick(1), Pick('ids', 'mask')
        return f"Pick({', '.join(map(repr, impl.keys))})"
    return type(impl).__qualname__


def _crossings(plan: Plan) -> set[tuple[str | None, str]]:
    """(slot, target host) of every value that changes host; None is the graph input."""
    if not plan.placement.multi_host:
        return set()
    from .plan import distribute

    return {(c.slot, c.target) for c in distribute(plan).crossings}


def _inputs(
    plan: Plan, node: str, inputs: tuple[str, ...], crossed: set[tuple[str | None, str]]
) -> str:
    host = plan.placement.host(node)
    names = []
    for i in inputs or (None,):
        name = "input" if i is None else i
        if (i, host) in crossed:
            name += f" ({plan.placement.host(i) if i is not None else LOCAL} -> {host})"
        names.append(name)
    return "<- " + ", ".join(names)


def to_text(g: Graph, indent: str = "") -> str:
    """One line per step, in plan order: id, class, marks, inputs; subgraphs indented.

    Example:
        >>> from somatize import Graph, Node, Done
        >>> class A(Node):
        ...     def forward(self, x, ctx): return Done(x)
        >>> print(Graph.somatize(A() >> A()).cache("a").to_text())
        a    A  [cached]  <- input
        a_2  A            <- a
    """
    from .graph import Graph

    plan = g.plan()
    crossed = _crossings(plan)
    rows: list[tuple[str, str, str, str, Graph | None]] = []
    for s in plan.steps:
        impl = g[s.node]
        marks = g.memory.marks(s.node)
        host = plan.placement.host(s.node)
        if plan.placement.multi_host:
            marks.append(f"@{host}")
        device = plan.placement.device(s.node)
        if device:
            marks.append(f"on {device}")
        rows.append(
            (
                s.node,
                _kind(impl),
                f"[{', '.join(marks)}]" if marks else "",
                _inputs(plan, s.node, s.inputs, crossed),
                impl if isinstance(impl, Graph) else None,
            )
        )
    widths = [max(len(cell) for cell in column) for column in list(zip(*rows, strict=True))[:3]]
    lines = []
    for node, kind, labels, inputs, sub in rows:
        lines.append(
            f"{indent}{node:<{widths[0]}}  {kind:<{widths[1]}}  {labels:<{widths[2]}}  {inputs}".rstrip()
        )
        if sub is not None:
            lines.append(to_text(sub, indent + "    "))
    for sink in plan.output:
        if (sink, LOCAL) in crossed:
            lines.append(f"{indent}output <- {sink} ({plan.placement.host(sink)} -> {LOCAL})")
    return "\n".join(lines)


def _label(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def to_mermaid(g: Graph) -> str:
    """A Mermaid ``flowchart LR``; cached nodes drawn with a cylinder, frozen ones dashed."""
    lines = ["flowchart LR", "  input((input))"]
    counter = iter(range(1 << 30))
    classes: list[str] = []

    def emit(graph: Graph, pad: str, prefix: str) -> tuple[dict[str, str], dict[str, str]]:
        """Draw nodes; return entry and exit mermaid ids of each node id."""
        from .graph import Graph

        plan = graph.plan()
        entry: dict[str, str] = {}
        exit_: dict[str, str] = {}
        hosts: dict[str, list[str]] = {}
        for s in plan.steps:
            hosts.setdefault(plan.placement.host(s.node), []).append(s.node)
        clustered = plan.placement.multi_host
        for host, members in hosts.items():
            inner = pad
            if clustered:
                lines.append(f'{pad}subgraph host_{next(counter)} ["host: {_label(host)}"]')
                inner = pad + "  "
            for node in members:
                impl = graph[node]
                mid = f"n{next(counter)}"
                marks = graph.memory.marks(node)
                text = _label(f"{prefix}{node}: {_kind(impl)}")
                if marks:
                    text += "<br/>" + _label(", ".join(marks))
                if isinstance(impl, Graph):
                    lines.append(f'{inner}subgraph {mid} ["{text}"]')
                    emit(impl, inner + "  ", prefix + node + "/")
                    lines.append(f"{inner}end")
                    entry[node] = exit_[node] = mid
                    continue
                shape = f'[("{text}")]' if node in graph.memory.cached else f'["{text}"]'
                lines.append(f"{inner}{mid}{shape}")
                if node in graph.memory.frozen:
                    classes.append(mid)
                entry[node] = exit_[node] = mid
            if clustered:
                lines.append(f"{pad}end")
        host_of = plan.placement.host
        for s in plan.steps:
            for i in s.inputs:
                arrow = "-.->|crosses|" if host_of(i) != host_of(s.node) else "-->"
                lines.append(f"{pad}{exit_[i]} {arrow} {entry[s.node]}")
        return entry, exit_

    entry, _ = emit(g, "  ", "")
    for root in g.topology.roots:
        arrow = "-.->|crosses|" if g.placement.host(root) != LOCAL else "-->"
        lines.append(f"  input {arrow} {entry[root]}")
    if classes:
        lines.append("  classDef frozen stroke-dasharray: 5 5")
        lines.append(f"  class {','.join(classes)} frozen")
    return "\n".join(lines)
