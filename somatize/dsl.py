"""The composition language: ``a >> b`` runs ``b`` on ``a``'s output; ``a | b`` forks.

``a >> (b | c) >> d`` hands ``d`` both outputs as a tuple, in written order — what
``nn.Sequential`` cannot express. Ids default to the class name in snake case,
made unique (``classify``, ``classify_2``); ``node.with_id("enc")`` sets one.
The same node instance written twice is one node: it may feed two branches, but not
itself, nor one node twice. Given two ids (``enc.with_id("l")``, ``enc.with_id("r")``) it
is two nodes sharing the instance, its weights too (a siamese encoder). ``>>`` binds tighter than ``|`` (Python's precedence): a
fork needs its parentheses, ``a >> b | c`` is ``(a >> b) | c``.

Example:
    >>> from somatize import Node, Done, Graph
    >>> class Inc(Node):
    ...     def forward(self, x, ctx): return Done(x + 1)
    >>> class Add(Node):
    ...     def forward(self, pair, ctx): return Done(pair[0] + pair[1])
    >>> Graph.somatize(Inc() >> (Inc() | Inc()) >> Add()).forward(0)
    4
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from . import not_a_module
from .compose import Composable
from .dsl_checks import (
    FIX,
    check_ends,
    check_repeats,
    check_starts,
    ends_twice,
    side_by_side,
)
from .errors import DuplicateNodeError, GraphError
from .graph import Graph
from .node import Mapped, Node
from .not_a_node import instead

__all__ = ["Expr", "Par", "Ref", "Seq", "build", "par", "seq"]


class Expr(Composable):
    """A composition of nodes, built with ``>>`` and ``|``; ``Graph.somatize`` makes it a graph."""

    # (a >> b)(x), (a >> b).forward(x): not a graph yet; errors naming Graph.somatize
    __call__ = not_a_module.expr_called
    forward = not_a_module.Refused(
        "an expression of nodes (written with >> or |) has no forward: build the graph once, "
        "g = Graph.somatize(expr), then g.forward(x), or st.module(g)(x) (somatize.torch)"
    )

    def with_id(self, node_id: str) -> Expr:
        """Refused: an id names one node; this is a composition of several."""
        raise TypeError(
            f"with_id({node_id!r}) names one node, and this is a composition of several "
            f"(written with >> or |); make it one subgraph node first: "
            f"Graph.somatize(a >> b).with_id({node_id!r})"
        )

    def mapped(self) -> Expr:
        """Refused: a composition is not mapped as a whole."""
        raise TypeError(
            "mapped() applies one node item by item, and this is a composition of several "
            "(written with >> or |); map each node (a.mapped() >> b.mapped())"
        )


@dataclass(frozen=True, eq=False)
class Ref(Expr):
    """One node (or subgraph), with an explicit id or None for the default.

    What ``with_id`` returns, so it answers what a node would after it: ``.mapped()``
    (``n.with_id("a").mapped()`` is ``n.mapped().with_id("a")``) and ``.with_id()``
    (the last id written names the node).
    """

    impl: Any
    id: str | None = None

    def with_id(self, node_id: str) -> Ref:
        """The same node under ``node_id`` instead."""
        return Ref(self.impl, node_id)

    def mapped(self) -> Ref:
        """The node applied item by item, keeping this id.

        Raises:
            TypeError: the node is a ``Graph`` or mapped already (naming it and the fix).
        """
        if isinstance(self.impl, Mapped):
            raise TypeError(
                f"node {self.id!r} is mapped already, and mapped() applies once; "
                "write .mapped() once"
            )
        if not isinstance(self.impl, Node):
            raise TypeError(
                f"node {self.id!r} is a {type(self.impl).__qualname__}, and only a Node is "
                "mapped item by item; map a node inside it (Graph.somatize(node.mapped()))"
            )
        return Ref(self.impl.mapped(), self.id)


class _Parts(Expr):
    """A flat run of parts. ``x >> y`` on a long run links to it instead of copying it,
    so writing a chain of N nodes one ``>>`` at a time costs O(N), not O(N²); the parts
    are flattened once, when first read."""

    __slots__ = ("_base", "_more", "_parts")

    def __init__(self, parts: tuple[Expr, ...] = (), _base: _Parts | None = None) -> None:
        self._base = _base  # parts come after the base's
        self._more = parts
        self._parts: tuple[Expr, ...] | None = None if _base is not None else parts

    @property
    def parts(self) -> tuple[Expr, ...]:
        if self._parts is None:
            runs = []
            link: _Parts | None = self
            while link is not None and link._parts is None:
                runs.append(link._more)
                link = link._base
            flat = list(link.parts) if link is not None else []  # (already flat)
            for run in reversed(runs):
                flat.extend(run)
            self._parts = tuple(flat)
            self._base = None  # the chain can go
        return self._parts

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.parts!r})"

    @classmethod
    def of(cls, a: Any, b: Any) -> _Parts:
        left, right = lift(a), lift(b)
        more = right.parts if type(right) is cls else (right,)
        if type(left) is cls:
            return cls(tuple(more), _base=left)
        return cls((left, *more))


class Seq(_Parts):
    """``a >> b >> c``: each part runs on the previous one's output."""

    __slots__ = ()


class Par(_Parts):
    """``a | b | c``: the parts run side by side on the same input."""

    __slots__ = ()


not_a_module.install(Expr, "expr")  # (a >> b).parameters(): an error naming Graph.somatize


def lift(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, (Node, Graph)):
        return Ref(x)
    fix = instead(x)
    raise TypeError(
        f"cannot compose a {type(x).__qualname__} with >> or |; "
        f"only Nodes, Graphs and their compositions combine{'; ' + fix if fix else ''}"
    )


def seq(a: Any, b: Any) -> Seq:
    return Seq.of(a, b)  # type: ignore[return-value]


def par(a: Any, b: Any) -> Par:
    return Par.of(a, b)  # type: ignore[return-value]


def default_id(impl: Any) -> str:
    """``ClassifyHead`` → ``classify_head``; a mapped node takes its inner node's name."""
    cls = type(impl.inner if isinstance(impl, Mapped) else impl)
    return _snake(cls.__name__)


@functools.lru_cache(maxsize=1024)
def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def build(expr: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """Nodes (id, implementation) and edges of an expression, in written order.

    A node is an instance under an id: written twice under one id (or with none), one node;
    given two ids (``enc.with_id("left")``, ``enc.with_id("right")``), two nodes sharing it
    (a siamese encoder: one set of weights applied to two inputs).

    Raises:
        DuplicateNodeError: one explicit id given to two different nodes, or an instance
            with two ids written without one (which node it means is not said).
    """
    root = lift(expr)
    refs = _refs(root)
    owner: dict[str, int] = {}  # explicit id -> the instance it names
    given: dict[int, list[str]] = {}  # instance -> its explicit ids, in written order
    for r in refs:  # explicit ids first, so a default never takes one
        if r.id is None:
            continue
        known = owner.get(r.id)
        if known is None:
            owner[r.id] = id(r.impl)
            given.setdefault(id(r.impl), []).append(r.id)
        elif known != id(r.impl):
            raise DuplicateNodeError(
                f"id {r.id!r} is given to two different nodes; give each its own id "
                f"(.with_id({r.id + '_2'!r})), or write the same instance twice to mean one node"
            )
    taken = set(owner)
    names: dict[int, str] = {}  # each written reference (by id(ref)) -> its node's id
    defaults: dict[int, str] = {}  # instance written with no id -> its default id
    nodes: list[tuple[str, Any]] = []
    added: set[str] = set()
    # base id -> the suffix it last got: every earlier one is taken (taken only grows), so
    # the search resumes there and N nodes of one class cost O(N), not O(N²)
    tried: dict[str, int] = {}
    for r in refs:  # then defaults, and every node once, in written order
        if r.id is not None:
            nid = r.id
        else:
            own = given.get(id(r.impl))
            if own is not None and len(own) > 1:
                raise DuplicateNodeError(
                    f"one instance is written with ids {', '.join(map(repr, own))} (one node "
                    f"under each, sharing it) and once without an id, which would not say "
                    f"which of them it is; write that one with its id, "
                    f".with_id({own[0]!r})"
                )
            nid = own[0] if own is not None else defaults.get(id(r.impl), "")
            if not nid:
                base = default_id(r.impl)
                n = tried.get(base, 1)
                nid = base if n == 1 else f"{base}_{n}"
                while nid in taken:
                    n += 1
                    nid = f"{base}_{n}"
                tried[base] = n
                defaults[id(r.impl)] = nid
                taken.add(nid)
        names[id(r)] = nid
        if nid not in added:
            added.add(nid)
            nodes.append((nid, r.impl))

    edges: list[tuple[str, str]] = []
    have: set[tuple[str, str]] = set()
    starts, ends = _walk(root, names, edges, have)
    check_repeats([names[id(r)] for r in refs], edges)
    check_starts(starts, edges)
    check_ends(ends, edges)
    return nodes, edges


def _walk(
    e: Expr, ids: dict[int, str], edges: list[tuple[str, str]], have: set[tuple[str, str]]
) -> tuple[list[str], list[str]]:
    """The sources and sinks of ``e``, its edges added to ``edges`` (each once: ``have``);
    ``ids``: each reference's node id, by ``id(ref)``.
    (A function of its own, not a closure calling itself: that would be a cycle per build.)"""
    if isinstance(e, Ref):
        nid = ids[id(e)]
        return [nid], [nid]
    if isinstance(e, Par):
        srcs: list[str] = []
        sinks: list[str] = []
        branches: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
        for p in e.parts:
            s, k = _walk(p, ids, edges, have)
            if (tuple(s), tuple(k)) in branches:  # ((a >> c) | (a >> c)): one branch
                ids_ = list(dict.fromkeys([*s, *k]))
                what = f"node {ids_[0]!r}" if len(ids_) == 1 else f"the branch {' >> '.join(ids_)}"
                raise GraphError(
                    f"{what} is written twice side by side (x | x), and one instance "
                    f"written twice is one node: the fork would give its output twice; {FIX}"
                )
            branches.add((tuple(s), tuple(k)))
            srcs += s
            sinks += k
        side_by_side(srcs, sinks)
        # a node beginning two branches is one node the fork's input reaches once:
        # (enc >> a) | (enc >> b) after pre is pre -> enc -> {a, b}
        return list(dict.fromkeys(srcs)), sinks
    assert isinstance(e, Seq)
    first_src, prev_sinks = _walk(e.parts[0], ids, edges, have)
    for p in e.parts[1:]:
        s, k = _walk(p, ids, edges, have)
        ends_twice(prev_sinks, s)
        # an edge a shared chain gives again is that edge ((t >> a) | (t >> b), t = x >> y:
        # x -> y once); one step giving it twice (a >> (b | b)) is refused below
        step = [(a, b) for b in s for a in prev_sinks]
        edges.extend(edge for edge in step if edge not in have)
        have.update(step)
        prev_sinks = k
    return first_src, prev_sinks


def _refs(e: Expr) -> list[Ref]:
    if isinstance(e, Ref):
        return [e]
    return [r for p in e.parts for r in _refs(p)]  # type: ignore[attr-defined]
