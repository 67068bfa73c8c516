"""A failure ``torch.compile`` raises while tracing a node, named by the node.

Dynamo's errors (a graph break under ``fullgraph=True``, a data-dependent guard) show
the user code they stopped in — a file and line of a node's ``forward`` — but not which
node: a class used for several nodes, or one in a subgraph, leaves the reader to guess.
The Trainer adds a note naming the node ids whose ``forward`` holds that line, and the
two ways on: make the node traceable, or compile without ``fullgraph``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import add_note
from ..graph import Graph

__all__ = ["traced_node_note"]


def traced_node_note(e: BaseException, net: Any) -> None:
    """Add to dynamo's error ``e`` a note naming the node of ``net`` (a ``GraphModule``,
    or the module a compiled wrapper holds) whose code it stopped in. Nothing when ``e``
    is not dynamo's, or the code it stopped in is not a node's."""
    stack = getattr(e, "real_stack", None)
    if not stack or not type(e).__module__.startswith("torch._dynamo"):
        return
    graph = getattr(getattr(net, "_orig_mod", net), "graph", None)
    if not isinstance(graph, Graph):
        return
    for frame in reversed(list(stack)):  # the innermost node frame
        found = [(nid, name) for nid, name, code in _forwards(graph) if _holds(code, frame)]
        if found:
            where = f"{found[0][1]}.forward, {frame.filename}:{frame.lineno}"
            nodes = " or ".join(repr(nid) for nid, _ in found)
            add_note(
                e,
                f"torch.compile could not trace node {nodes} ({where}): make it traceable "
                "(torch.where or torch.cond for a branch on a tensor's value; no .item(), "
                ".numpy() or .tolist() of a traced tensor), or compile without "
                "fullgraph=True — it then runs that part eagerly, a graph break; "
                "torch._dynamo.explain(st.module(g))(x) lists them",
            )
            return


def _forwards(g: Graph, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(node path, its class, its forward's code) of every node of ``g``, subgraphs' inside."""
    for nid in g.nodes():
        impl = g[nid]
        if isinstance(impl, Graph):
            yield from _forwards(impl, f"{prefix}{nid}.")
            continue
        code = getattr(getattr(type(impl), "forward", None), "__code__", None)
        if code is not None:
            yield f"{prefix}{nid}", type(impl).__qualname__, code


def _holds(code: Any, frame: Any) -> bool:
    """Whether ``frame`` (a ``traceback.FrameSummary``) is a line of ``code``."""
    if frame.filename != code.co_filename or frame.lineno is None:
        return False
    lines = [line for _, _, line in code.co_lines() if line is not None]
    return bool(lines) and min(lines) <= frame.lineno <= max(lines)
