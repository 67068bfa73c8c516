"""Graph: the user's handle on the five facts.

A ``Graph`` holds a topology, a catalog, a placement, a plan and a memory (and the
keeper, codecs and watchers it runs with) and delegates to them. It stays small:
construction, ``forward``, introspection, rendering, memory settings.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import not_a_module
from .bulk import paused_gc
from .catalog import Catalog
from .codecs import Codec, check_codecs
from .compose import Composable
from .errors import DuplicateNodeError, GraphError, MissingNodeError
from .execute import Outcome, Program
from .graph_run import build_program, run_keyed
from .graph_settings import Settings
from .keepers.pins import PinLog
from .keepers.protocol import check_keeper
from .memory import Memory, NodeKeys
from .node import Ctx, Done, Node, Run, check_forward, graph_input
from .not_a_node import id_instead, not_a_node
from .placement import Placement
from .plan import Plan, compile
from .topology import Builder, Topology
from .values import digest
from .watchers import check_watchers

if TYPE_CHECKING:
    from typing_extensions import Never

    from .dsl import Expr
    from .explain import Explanation
    from .keepers import Keeper
    from .transports import Transport
    from .watchers import Watcher

__all__ = ["Graph"]

Forward = Callable[[Any, Ctx], Done]


class Graph(Settings, Composable):
    """A graph of nodes: build it, set what it remembers, run it.

    Args:
        keeper: where cached outputs go (default: a ``MemoryKeeper`` made on first need).
        codecs: codecs for non-plain data values (``somatize.torch`` adds its own).
        watchers: told of every run, node, cache hit and metric.

    Example:
        >>> from somatize import Node, Done
        >>> class Upper(Node):
        ...     def forward(self, text, ctx): return Done(text.upper())
        >>> g = Graph()
        >>> g.node("up", Upper()).cache("up").forward("hi")
        'HI'
    """

    def __init__(
        self,
        *nodes: Never,
        keeper: Keeper | None = None,
        codecs: Sequence[Codec] = (),
        watchers: Iterable[Watcher] = (),
    ) -> None:
        if nodes:  # Graph(a >> b), as nn.Sequential(a, b) would be written
            raise TypeError(
                f"Graph() takes no nodes, got {len(nodes)}: build a graph from an expression "
                "with Graph.somatize(a >> b) (| for a fork), or Graph() and then "
                "g.node(id, node) and g.edge(a_id, b_id)"
            )
        self._impls: dict[str, Any] = {}
        self._subs: dict[str, Graph] = {}  # the nodes that are graphs (nodes are never removed)
        self._shape = Builder()  # node ids and edges, checked edge by edge
        self.placement = Placement()
        self.memory = Memory()
        self.keeper = check_keeper(keeper, "Graph(keeper=...)")
        self.codecs: tuple[Codec, ...] = check_codecs(codecs, "Graph(codecs=...)")
        self.watchers: list[Watcher] = check_watchers(watchers, "Graph(watchers=...)")
        #: A runtime's hook (``somatize.torch`` sets it): ``(node_id, impl, forward) -> forward``.
        self.wrap: Callable[[str, Any, Forward], Forward] | None = None
        self.run_id = uuid.uuid4().hex[:12]
        self._program: Program | None = None
        self._topology: Topology | None = None
        self._version = 0  # bumped on every change; graphs holding this one as a node watch it
        self._built_from: tuple[Any, ...] = ()  # the stamp the program was built from
        self._topology_from: tuple[Any, ...] = ()  # subgraph stamps the topology was built from
        self._keys: NodeKeys | None = None
        self._pins = PinLog()
        # the MemoryKeeper made on first need (not chosen), and the subgraphs whose own keeper
        # is passed over, as checked and warned of (nested_keepers.py)
        self._made_keeper: Keeper | None = None
        self._keepers_checked: tuple[Program, Keeper | None] | None = None
        self._keepers_said: set[tuple[str, int, int]] = set()

    # -- construction -----------------------------------------------------------------

    @classmethod
    def somatize(cls, expr: Expr | Node | Graph, *more: Never, **kwargs: Any) -> Graph:
        """A graph from a ``>>`` / ``|`` expression (ids default to snake-case class names).

        Its outputs are its sinks: an end of the expression that feeds another node
        (``(trunk >> head) | trunk``) is a ``GraphError``, not a value left out.
        """
        from .dsl import build

        if more:  # Graph.somatize(a, b), as nn.Sequential(a, b) would be written
            raise TypeError(
                f"Graph.somatize takes one expression, got {1 + len(more)} arguments: join "
                "the nodes with >> (one after another) or | (side by side), "
                "Graph.somatize(a >> b)"
            )

        g = cls(**kwargs)
        with paused_gc():  # many small objects, no cycles to reclaim (see bulk.py)
            nodes, edges = build(expr)
            for nid, impl in nodes:
                g.node(nid, impl)
            for a, b in edges:
                g.edge(a, b)
        return g

    def with_id(self, node_id: str) -> Expr:
        """This graph as a node under an explicit id, for ``>>`` / ``|`` (as ``Node.with_id``):
        the id its modules register under (``block.lin.weight``), instead of ``graph``."""
        from .dsl import Ref

        return Ref(self, node_id)

    def node(self, node_id: str, impl: Node | Graph) -> Graph:
        """Add a node (a ``Node``, or a ``Graph`` run as one step). Returns the graph."""
        if not isinstance(impl, (Node, Graph)):
            raise TypeError(f"node {node_id!r}: {not_a_node(node_id, impl)}")
        if impl is self or (isinstance(impl, Graph) and impl._contains(self)):
            raise GraphError(
                f"node {node_id!r}: a graph cannot contain itself, directly or through a "
                "subgraph; build a new Graph for the inner part"
            )
        if node_id in self._impls:
            raise DuplicateNodeError(
                f"node id {node_id!r} is already in the graph; choose another id"
            )
        if isinstance(impl, Node):
            check_forward(node_id, impl)
        self._shape.add_node(node_id)  # validates the id before anything changes
        self._impls[node_id] = impl
        if isinstance(impl, Graph):
            self._subs[node_id] = impl
        self._changed()
        return self

    def edge(self, source: str, target: str) -> Graph:
        """Add an edge; a node with several inputs receives them in the order edges were added."""
        self._require(source)
        self._require(target)
        self._shape.add_edge(source, target)  # checks it, changing nothing if it is invalid
        self._changed()
        return self

    def _require(self, node_id: str) -> None:
        if not isinstance(node_id, str):  # (a node given for its id, a list of ids)
            raise MissingNodeError(
                f"no node {node_id!r} in the graph: {id_instead(node_id, self._impls)}; "
                f"nodes: {', '.join(self._impls) or 'none'}"
            )
        if node_id not in self._impls:
            raise MissingNodeError(
                f"no node {node_id!r} in the graph; nodes: {', '.join(self._impls) or 'none'}"
            )

    def _changed(self) -> None:
        self._program = None
        self._topology = None
        self._version += 1

    def _subgraphs(self) -> dict[str, Graph]:
        return self._subs

    def _stamp(self) -> tuple[Any, ...]:
        """What this graph's program is built from, subgraphs' at any depth included: also
        attributes assigned directly (``g.wrap = ...``, ``g.codecs = ...``), not only changes
        made through methods."""
        own = (self._version, self.memory, self.placement, self.codecs, self.wrap)
        return (*own, *(s._stamp() for s in self._subs.values())) if self._subs else own

    def _contains(self, other: Graph) -> bool:
        return any(s is other or s._contains(other) for s in self._subgraphs().values())

    def use(
        self,
        *,
        codecs: Sequence[Codec] | None = None,
        wrap: Callable[[str, Any, Forward], Forward] | None = None,
    ) -> Graph:
        """Set the runtime the graph runs with: codecs, and a hook wrapping node forwards.

        ``somatize.torch`` calls this (through ``module(g)``) to add its tensor codecs and
        to run frozen nodes under ``torch.no_grad()``. The wrap gets every node's forward,
        a subgraph node's included (its nodes run on the ``ctx`` the wrap passes on). A
        wrapped forward may have a ``prepare()`` method (a class with ``__slots__`` holding
        ``forward`` may wrap one that has): it is called before the node's key is read. A
        wrap's ``draws(forward, x, ctx) -> (result, drew)`` says if a forward drew (drawn.py).
        """
        if codecs is not None:
            self.codecs = check_codecs(codecs, "Graph.use(codecs=...)")
        if wrap is not None:
            self.wrap = wrap
        self._changed()
        return self

    # -- the five facts ---------------------------------------------------------------

    @property
    def topology(self) -> Topology:
        subgraphs = self._subgraphs()
        stamps = tuple(sub._stamp() for sub in subgraphs.values())
        if self._topology is None or stamps != self._topology_from:
            subs = {n: sub.topology for n, sub in subgraphs.items()}
            self._topology = self._shape.topology(subs)  # (checked as nodes and edges came)
            self._topology_from = stamps
        return self._topology

    @property
    def catalog(self) -> Catalog:
        return Catalog(self._impls)

    def plan(self) -> Plan:
        """The plan: steps in topological order, stages of independent steps."""
        subs = {n: sub.placement for n, sub in self._subgraphs().items()}
        return compile(self.topology, self.placement, subs)

    def nodes(self) -> tuple[str, ...]:
        """Node ids, in the order they were added."""
        return tuple(self._impls)

    def edges(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._shape.edges)

    def __getitem__(self, node_id: str) -> Any:
        if not isinstance(node_id, str):  # list(g), torch.optim.Adam(g): indexes 0, 1, ...
            raise TypeError(
                f"a Graph is indexed by node id (g[{next(iter(self._impls), 'enc')!r}]), "
                f"not by {type(node_id).__name__}, and is not a sequence of parameters: "
                "for an optimizer, pass st.parameters(g) (somatize.torch), "
                "or st.module(g).parameters()"
            )
        self._require(node_id)
        return self._impls[node_id]

    # a Graph used as the nn.Module it is not (g(x), g.parameters()): errors naming the fix
    __call__ = not_a_module.called

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._impls

    def __len__(self) -> int:
        return len(self._impls)

    # -- running ------------------------------------------------------------------------

    def program(self) -> Program:
        """The executable form of the graph, built once per change."""
        stamp = self._stamp()
        if self._program is None or stamp != self._built_from:
            program = build_program(self)
            self._built_from = stamp
            self._program = program
        return self._program

    def forward(
        self,
        *inputs: Any,
        step: int = 0,
        training: bool = False,
        values: Mapping[str, Any] | None = None,
        transports: Mapping[str, Transport] | None = None,
    ) -> Any:
        """Run the graph on ``inputs`` and return its output (Opaque unwrapped).

        Every root node receives the input (a tuple when several are given). With
        one sink the output is its value; with several, a tuple in node order.
        Slices placed on other hosts go to ``transports``, by host name
        (``somatize.transports``; see docs/distributed.md).

        Example:
            >>> from somatize import Node, Done
            >>> class Neg(Node):
            ...     def forward(self, x, ctx): return Done(-x)
            >>> Graph.somatize(Neg()).forward(2)
            -2
        """
        return self.run(
            *inputs, step=step, training=training, values=values, transports=transports
        ).value

    def run(
        self,
        *inputs: Any,
        step: int = 0,
        training: bool = False,
        values: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        transports: Mapping[str, Transport] | None = None,
    ) -> Outcome:
        """Like ``forward``, but returns the ``Outcome``: value, key and node metrics."""
        program = self.program()
        x, opaque, injected = graph_input(inputs, values, self.codecs)
        run = Run(run_id or self.run_id, step, training, injected)
        if self.placement.hosts and self.placement.multi_host:  # nodes on other hosts
            from .hosts import run_across

            return run_across(self, program, x, opaque, run, transports)
        if not (program.keyed or self.watchers):
            value, metrics = program.run_fast(x, run)
            return Outcome(value, False, None, metrics)
        return run_keyed(self, program, x, opaque, run)

    def explain(
        self, *inputs: Any, step: int = 0, values: Mapping[str, Any] | None = None
    ) -> Explanation:
        """Why each remembered node would hit or miss on ``inputs``, writing nothing.

        Runs the graph (in eval mode) against a read-only view of the keeper and, for each
        cached node that misses, says what changed since the last entry stored under it:
        the code (naming the class or helper), the declaration, the state (weights) or the
        input. See ``somatize/explain.py``.

        Example:
            >>> from somatize import Node, Done
            >>> class Upper(Node):
            ...     def forward(self, text, ctx): return Done(text.upper())
            >>> g = Graph().node("up", Upper()).cache("up")
            >>> _ = g.forward("hi"); print(g.explain("hi"))
            up: hit
        """
        from .explain import explain_run

        return explain_run(self, inputs, step, values)

    @property
    def keys(self) -> NodeKeys:
        """The key computer of this graph (identity and declaration remembered per node)."""
        if self._keys is None or self._keys.codecs != self.codecs:
            self._keys = NodeKeys(self.codecs)
        return self._keys

    def key_parts(self, keys: NodeKeys) -> tuple[str, str, str]:
        """Identity, declaration and state of this graph as a subgraph node: its nodes' parts."""
        parts = [keys.parts(self._impls[n]) for n in self.topology.order]
        return (
            "somatize.Graph:" + digest((self.topology.digest, [p[0] for p in parts])),
            digest([p[1] for p in parts]),
            digest([p[2] for p in parts]),
        )

    # -- rendering ----------------------------------------------------------------------

    def to_mermaid(self) -> str:
        """A Mermaid flowchart: cached and frozen nodes marked, subgraphs nested."""
        from .render import to_mermaid

        return to_mermaid(self)

    def to_text(self) -> str:
        """A plain-text outline of the plan: one line per step, marks and inputs."""
        from .render import to_text

        return to_text(self)

    def __repr__(self) -> str:
        return f"Graph({len(self._impls)} nodes, {len(self._shape.edges)} edges)"

    def __getstate__(self) -> dict[str, Any]:
        # What is derived (program, keys) is rebuilt on the other side; a runtime's hook
        # is not data and is installed again there (module(g) does it).
        drop = {"_program", "_topology", "_keys", "wrap", "_keepers_checked"}
        return {k: (None if k in drop else v) for k, v in self.__dict__.items()}


not_a_module.install(Graph)  # g.parameters(), g.to(...): errors naming st.module(g)
