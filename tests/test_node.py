"""Node, Done, Ctx, Mapped: the contract a node keeps and the channel it reads."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Ctx, Done, Graph, Mapped, Node, NodeError, Opaque, Run


class Echo(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


class Sees(Node):
    """Returns what it was told through ctx."""

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done([ctx.node, ctx.device, ctx.run_id, ctx.step, ctx.training, ctx.get("k")])


def test_done_carries_value_and_metrics() -> None:
    d = Done(1, metrics={"loss": 0.5})
    assert d.value == 1 and d.metrics == {"loss": 0.5}
    assert Done(2).metrics is None


def test_ctx_is_read_only() -> None:
    ctx = Ctx("n", "cpu", Run("r", 3, True, {"k": 1}))
    with pytest.raises(AttributeError):
        ctx.node = "m"  # type: ignore[misc]
    assert (ctx.run_id, ctx.step, ctx.training, ctx.values["k"], ctx.get("absent", 7)) == (
        "r",
        3,
        True,
        1,
        7,
    )


def test_ctx_brings_id_device_run_and_injected_values() -> None:
    g = Graph().node("s", Sees()).place("s", device="cuda:1")
    out = g.forward(0, step=5, training=True, values={"k": "v"})
    assert out == ["s", "cuda:1", g.run_id, 5, True, "v"]


def test_injected_values_cannot_be_changed_by_a_node() -> None:
    class Writes(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            ctx.values["k"] = "changed"  # type: ignore[index]
            return Done(x)

    injected = {"k": "v"}
    with pytest.raises(TypeError):
        Graph.somatize(Writes()).forward(0, values=injected)
    assert injected == {"k": "v"}


def test_constructor_arguments_are_recorded_without_user_code() -> None:
    class Embed(Node):
        def __init__(self, dim: int, scale: float = 1.0) -> None:
            self.dim = dim

        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x)

    e = Embed(4, scale=2.0)
    assert e._somatize_args == ((4,), {"scale": 2.0})


def test_a_node_without_init_takes_no_arguments() -> None:
    with pytest.raises(TypeError, match=r"Echo\(\) takes no arguments .* given 1; define __init__"):
        Echo(1)  # type: ignore[call-arg]


def test_a_node_without_forward_says_what_to_write() -> None:
    class Lazy(Node):
        pass

    with pytest.raises(NodeError, match=r"Lazy must implement forward\(self, x, ctx\)"):
        Graph.somatize(Lazy()).forward(1)


class Misspelt(Node):
    def foward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


class Callable_(Node):
    def __call__(self, x: Any) -> Done:
        return Done(x)


class Unrelated(Node):
    def run(self, x: Any) -> Done:
        return Done(x)


@pytest.mark.parametrize(
    ("node", "said"),
    [
        (Misspelt(), r"it defines no forward \(foward is not forward: a typo\?\)$"),
        (Callable_(), r"\(the graph calls forward\(x, ctx\), never the node: rename __call__"),
        (Unrelated(), r"it defines no forward$"),  # (nothing near: nothing added)
    ],
)
def test_a_node_without_forward_is_told_of_a_near_miss(node: Node, said: str) -> None:
    with pytest.raises(NodeError, match=said):
        Graph.somatize(node)


def test_a_node_without_forward_is_refused_when_added_naming_it() -> None:
    class Lazy(Node):
        pass

    pattern = r"^node 'lazy': .*Lazy must implement forward\(self, x, ctx\) -> Done; it defines"
    with pytest.raises(NodeError, match=pattern):
        Graph.somatize(Lazy())  # (before anything runs)
    with pytest.raises(NodeError, match=r"^node 'each': .*Lazy must implement forward"):
        Graph().node("each", Lazy().mapped())  # (a mapped node's inner node too)
    lazy = Lazy()
    lazy.forward = lambda x, ctx: Done(x)  # type: ignore[method-assign]  # (its own)
    assert Graph.somatize(lazy).forward(1) == 1


def test_a_mapped_nodes_inner_forward_is_checked_when_added() -> None:
    class NoCtx(Node):
        def forward(self, x: Any) -> Done:  # type: ignore[override]
            return Done(x)

    with pytest.raises(NodeError, match=r"node 'no_ctx': .*NoCtx\.forward\(self, x\) takes no ctx"):
        Graph.somatize(Echo().mapped() >> NoCtx().mapped())


def test_a_node_that_is_an_nn_module_too_is_refused_naming_the_fix() -> None:
    # torch's nn.Module as somatize knows it, by its class's module and name (no torch here)
    module = type("Module", (), {"__module__": "torch.nn.modules.module"})

    class Enc(module, Node):  # type: ignore[valid-type,misc]
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x)

    with pytest.raises(
        NodeError, match=r"^node 'enc': .*Enc is an nn\.Module as well as a Node"
    ) as e:
        Graph.somatize(Enc())
    assert "subclass Node alone, class Enc(Node)" in str(e.value)


def test_mapped_applies_item_by_item() -> None:
    class Inc(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x + 1)

    m = Inc().mapped()
    assert isinstance(m, Mapped)
    assert repr(m).endswith("Inc().mapped()")
    assert Graph.somatize(m).forward([1, 2, 3]) == [2, 3, 4]
    assert Graph.somatize(Inc().mapped()).forward(()) == []


def test_mapped_refuses_a_non_list_and_mapping_twice() -> None:
    with pytest.raises(NodeError, match=r"mapped node 'echo' received a int; .* takes a list"):
        Graph.somatize(Echo().mapped()).forward(3)
    with pytest.raises(TypeError, match=r"Echo\(\)\.mapped\(\) is mapped already.*only once"):
        Echo().mapped().mapped()
    with pytest.raises(
        TypeError, match=r"applies to a Node, not to 42 \(int\); write node\.mapped"
    ):
        Mapped(42)  # type: ignore[arg-type]


class Rows:
    """Stands for a tensor (no torch here): it has unbind."""

    def unbind(self, dim: int) -> tuple[int, ...]:
        return (1, 2)


def test_a_mapped_node_given_a_tensor_is_told_to_unbind_its_rows() -> None:
    with pytest.raises(NodeError, match=r"received a Rows; .*give it x\.unbind\(0\)$"):
        Graph.somatize(Echo().mapped()).forward(Opaque(Rows()))
    with pytest.raises(NodeError) as info:  # (no unbind: no hint)
        Graph.somatize(Echo().mapped()).forward(3)
    assert "unbind" not in str(info.value)


def test_mapped_opaque_items_give_one_opaque_list_and_mixing_is_an_error() -> None:
    class Wrap(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(Opaque({x}))  # a set: fine inside Opaque

    assert Graph.somatize(Wrap().mapped()).forward([1, 2]) == [{1}, {2}]

    class Mixed(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(Opaque(x) if x else x)

    with pytest.raises(NodeError, match="Opaque for some items and data for others"):
        Graph.somatize(Mixed().mapped()).forward([0, 1])


def test_mapped_item_returning_no_done_names_the_node() -> None:
    class Bad(Node):
        def forward(self, x: Any, ctx: Ctx) -> Any:
            return x

    with pytest.raises(
        NodeError, match=r"node 'bad' \(.*Bad\) returned int instead of Done.*return Done\(value\)"
    ):
        Graph.somatize(Bad().mapped()).forward([1])


class Measure(Node):
    """Reports the item's length (and, for some items, a note and a flag)."""

    def forward(self, x: Any, ctx: Ctx) -> Done:
        metrics: dict[str, Any] = {"len": len(x)}
        if len(x) > 1:
            metrics.update(note=x, long=True)
        return Done(x.upper(), metrics=metrics)


def test_mapped_items_metrics_are_averaged_over_the_items_that_report_them() -> None:
    from somatize import Recorder
    from somatize.watchers import Metrics

    want = {"measure": {"len": 2.0, "note": "ccc", "long": 1.0}}  # mean of 1, 2, 3; the last note
    g = Graph.somatize(Measure().mapped())
    assert g.run(["a", "bb", "ccc"]).metrics == want  # the hot path
    rec = Recorder()
    g.watchers.append(rec)  # the keyed path: the Metrics event too
    assert g.run(["a", "bb", "ccc"]).metrics == want
    assert [e.values for e in rec.events if isinstance(e, Metrics)] == [want["measure"]]
    assert g.run([]).metrics == {}
    cached = Graph.somatize(Measure().mapped()).cache("measure")
    assert cached.run(["a", "bb"]).metrics == {"measure": {"len": 1.5, "note": "bb", "long": True}}
    # a hit reports nothing, as a cached node's hit does: the items computed only
    assert cached.run(["a", "bb", "dddd"]).metrics["measure"]["len"] == 4
    assert cached.run(["a", "bb"]).metrics == {}


def test_a_nodes_repr_shows_how_it_was_made_eliding_long_values() -> None:
    class Scale(Node):
        def __init__(self, factor: float, *, name: str = "s", table: Any = None) -> None:
            self.factor = factor

        def forward(self, x: Any, ctx: Any) -> Done:
            return Done(x * self.factor)

    assert repr(Scale(2.0, name="half")) == "Scale(2.0, name='half')"
    assert repr(Scale(1, table=list(range(100)))) == "Scale(1, table=<list>)"
    assert repr(Scale(3).mapped()) == "Scale(3).mapped()"
