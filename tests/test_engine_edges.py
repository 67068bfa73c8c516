"""The graph engine where an outside audit found it wrong: a default argument of a node's
method left out of its key; expressions that dropped a branch or refused a shared
chain; and errors that named the wrong thing (an empty subgraph, a keeper class, a
subgraph's inner hosts, ``g.explain`` with an ``Opaque`` input, the CLI on a ``None``)."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import (
    Ctx,
    DiskKeeper,
    Done,
    EmptyGraphError,
    Graph,
    GraphError,
    MemoryKeeper,
    Node,
    Opaque,
)
from somatize.cli import main


class Inc(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + 1)


class Double(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(2 * x)


class Show(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


def made_with(k: int) -> type[Node]:
    class Times(Node):
        def forward(self, x: Any, ctx: Ctx, k: int = k) -> Done:  # (k read as a default)
            return Done(x * k)

    return Times


def test_a_default_argument_of_a_nodes_method_is_in_its_key() -> None:
    keeper = MemoryKeeper()
    two = Graph.somatize(made_with(2)(), keeper=keeper).cache("times")
    seven = Graph.somatize(made_with(7)(), keeper=keeper).cache("times")
    assert (two.forward(1), seven.forward(1), two.forward(1)) == (2, 7, 2)


def test_a_branch_beginning_with_a_node_another_feeds_is_refused_not_dropped() -> None:
    n = Show()
    with pytest.raises(GraphError, match=r"node 'show' begins a branch .* fed by 'double'"):
        Graph.somatize((Double() >> n) | n)
    m = Show()  # after a node, it is a join of both
    assert Graph.somatize(Inc() >> ((Double() >> m) | m)).forward(10) == (22, 11)


def test_a_chain_shared_by_two_branches_is_one_chain() -> None:
    trunk = Inc() >> Double()
    g = Graph.somatize((trunk >> Inc()) | (trunk >> Double()))
    assert g.forward(3) == (9, 16)
    assert sorted(g.topology.edges) == [
        ("double", "double_2"),
        ("double", "inc_2"),
        ("inc", "double"),
    ]
    a, c = Inc(), Double()
    with pytest.raises(GraphError, match=r"the branch inc >> double is written twice side by side"):
        Graph.somatize((a >> c) | (a >> c))


def test_an_empty_subgraph_is_named() -> None:
    with pytest.raises(EmptyGraphError, match=r"node 'blk' is a subgraph with no nodes"):
        Graph.somatize(Inc() >> Graph().with_id("blk")).forward(1)


def test_a_keeper_class_is_refused_saying_to_make_one() -> None:
    with pytest.raises(
        TypeError, match=r"MemoryKeeper is the class, not a keeper.*MemoryKeeper\(\)"
    ):
        Graph(keeper=MemoryKeeper)  # type: ignore[arg-type]


def test_a_subgraphs_inner_hosts_are_refused_where_it_runs_inside_another() -> None:
    inner = Graph.somatize(Double() >> Inc()).place("inc", host="box")
    with pytest.raises(GraphError, match=r"subgraph moves as one unit.*'inc', host='local'"):
        Graph.somatize(Inc() >> inner).forward(1)
    inner.place("inc", host="local")  # what the message says to write: then it runs
    assert Graph.somatize(Inc() >> inner).forward(1) == 5


class Pair(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done([x[0], x[0] + 1])  # (the model beside it is not read)


def test_explain_takes_the_inputs_forward_takes() -> None:
    """It refused an Opaque beside data ("cannot pass an Opaque inside a data value")."""
    g = Graph.somatize(Pair() >> Inc().mapped()).cache("inc")
    assert g.forward(1, Opaque(object())) == [2, 3]
    assert isinstance(str(g.explain(1, Opaque(object()))), str)


def test_the_cli_explains_a_graph_on_a_none_input(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "pipe.py").write_text(
        "from somatize import Done, Graph, Node\n"
        "class Name(Node):\n"
        "    def forward(self, x, ctx):\n"
        "        return Done(repr(x))\n"
        "graph = Graph.somatize(Name()).cache('name')\n"
        "NOTHING = None\n"
    )
    DiskKeeper(tmp_path / "c")  # (an empty cache)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["cache", "explain", "pipe:graph", "pipe:NOTHING", "--dir", str(tmp_path / "c")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "name" in out.out
