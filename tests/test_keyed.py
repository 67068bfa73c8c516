"""The keyed walk (``somatize/keyed.py``): what it says about nodes whose keys it makes."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from somatize import Ctx, Done, Graph, MemoryKeeper, Node
from somatize.cache_warnings import ctx_reads


class AtLeast(Node):
    """Reads an injected value: a threshold that no key holds."""

    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done([x for x in xs if x >= ctx.get("min", 0)])


class Sum(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done(sum(xs))


class Named(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(f"{ctx.node} on {ctx.device}: {x}")  # (neither changes the output's key)


class Late(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done([x + ctx.step for x in xs] if ctx.training else list(xs))


class Drop(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done([0 for _ in xs] if ctx.training else list(xs))


def test_a_cached_node_or_one_feeding_it_that_reads_ctx_warns_naming_what() -> None:
    g = Graph.somatize(AtLeast() >> Sum(), keeper=MemoryKeeper()).cache("sum")
    with pytest.warns(
        UserWarning, match=r"node 'at_least' \(AtLeast\) is cached or feeds .*ctx\.get"
    ):
        g.forward([1, 2, 3], values={"min": 2})


def test_what_ctx_reads_are_found_and_which_are_harmless() -> None:
    assert ctx_reads(AtLeast) == {"get"}
    assert ctx_reads(Late) == {"step", "training"}  # (inside a comprehension too)
    assert ctx_reads(Named) == frozenset()
    g = Graph.somatize(Late(), keeper=MemoryKeeper()).cache("late")
    with pytest.warns(UserWarning, match=r"reads ctx\.step, ctx\.training"):
        g.forward([1], training=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Graph.somatize(Named(), keeper=MemoryKeeper()).cache("named").forward(1)
        Graph.somatize(AtLeast() >> Sum()).forward([1, 2])  # nothing cached: no key, fine
        frozen = Graph.somatize(Drop(), keeper=MemoryKeeper()).cache("drop").freeze("drop")
        frozen.forward([1], training=True)  # a frozen node's ctx.training is always False
        Graph.somatize(Drop(), keeper=MemoryKeeper()).cache("drop").forward([1])  # (eval)


def test_a_warning_raised_inside_model_x_points_at_the_users_line_not_torchs():
    """model(x) goes through nn.Module.__call__ before somatize: outside() skips torch's
    frames too (and Lightning's, whose hooks call LightningGraph)."""
    torch = pytest.importorskip("torch")
    import somatize.torch as st

    class Stepper(Node):
        def forward(self, x, ctx):
            return Done(x * (1 + 0 * ctx.step))

    g = Graph.somatize(Stepper().with_id("s"))
    g.cache("s")
    model = st.module(g)
    with pytest.warns(UserWarning, match=r"node 's' \(.*Stepper\) is cached") as said:
        model(torch.ones(2, 3))
    assert said[0].filename == __file__


class Inc(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + 1)


class Add3(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        a, b, c = xs  # (written for three inputs)
        return Done(a + b + c)


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_join_failing_on_its_inputs_is_told_what_it_received(path: str) -> None:
    from somatize import Recorder

    g = Graph.somatize(
        (Inc() | Inc().with_id("other")) >> Add3(), watchers=[Recorder()] * (path == "keyed")
    )
    with pytest.raises(ValueError, match="not enough values to unpack") as info:
        g.forward(1)
    assert info.value.__notes__ == [
        "raised by node 'add3' (Add3); its input x was one tuple of its 2 inputs, from 'inc', "
        "'other' in the order their edges were added: unpack it, a, b = x"
    ]


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_root_failing_on_the_graphs_inputs_is_told_it_gets_them_all(path: str) -> None:
    from somatize import Recorder

    g = Graph.somatize(Inc() | Inc().with_id("other"), watchers=[Recorder()] * (path == "keyed"))
    with pytest.raises(TypeError) as info:
        g.forward(1, 2)  # (a two-tower model: each root wants one of them)
    (note,) = info.value.__notes__
    assert note.startswith("raised by node 'inc' (Inc); its input x was its graph's input, a ")
    assert "tuple of 2: every root receives the whole input" in note and "x[0]" in note
    assert "precedence" not in note  # (several inputs, as towers take them)


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_graph_called_without_input_is_told_so(path: str) -> None:
    from somatize import Recorder

    g = Graph.somatize(Inc(), watchers=[Recorder()] * (path == "keyed"))
    with pytest.raises(TypeError) as info:
        g.forward()  # (as model() would: no input at all)
    assert info.value.__notes__ == [
        "raised by node 'inc' (Inc); its input x was its graph's input, an empty tuple: the "
        "graph was called with no input — give it one, model(x) or g.forward(x)"
    ]


class Split(Node):
    def forward(self, text: Any, ctx: Ctx) -> Done:
        return Done(text.split())


class EndMark(Node):
    def forward(self, words: Any, ctx: Ctx) -> Done:
        return Done(words + ["<end>"])  # noqa: RUF005 (a str given here must raise)


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_root_of_several_given_one_input_is_told_how_python_groups_the_operators(
    path: str,
) -> None:
    from somatize import Recorder

    # meant as Split() >> (Inc() | EndMark()) >> ...: EndMark became a root, fed the text
    g = Graph.somatize(
        Split() >> Named() | EndMark() >> Named().with_id("shown"),
        watchers=[Recorder()] * (path == "keyed"),
    )
    assert g.topology.roots == ("split", "end_mark")
    with pytest.raises(TypeError) as info:
        g.forward("a b")
    (note,) = info.value.__notes__
    assert note == (
        "raised by node 'end_mark' (EndMark); it is one of the graph's 2 roots ('split', "
        "'end_mark'), each fed the graph's input: if 'end_mark' should follow another node, "
        "mind Python's precedence — a >> b | c >> d is (a >> b) | (c >> d); write "
        "a >> (b | c) >> d"
    )
    fixed = Graph.somatize(Split() >> (Named() | EndMark()) >> Sum())
    with pytest.raises(AttributeError) as one_root:  # (one root: nothing on precedence)
        fixed.forward(3)
    assert "precedence" not in one_root.value.__notes__[0]


class Fails(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        raise RuntimeError("out of memory")


def test_an_error_that_is_not_about_the_input_keeps_the_plain_note() -> None:
    with pytest.raises(RuntimeError) as info:
        Graph.somatize((Inc() | Inc().with_id("other")) >> Fails()).forward(1)
    assert info.value.__notes__ == ["raised by node 'fails' (Fails)"]
    with pytest.raises(TypeError) as one:
        Graph.somatize(Inc() >> Inc().with_id("two")).forward("a")  # (one input: nothing to add)
    assert one.value.__notes__ == ["raised by node 'inc' (Inc)"]


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_root_given_a_list_is_told_a_batch_goes_in_as_its_inputs(path: str) -> None:
    from somatize import Recorder

    g = Graph.somatize(Inc(), watchers=[Recorder()] * (path == "keyed"))
    with pytest.raises(TypeError) as info:
        g.forward([1, 2])  # (a DataLoader batch [inputs, targets], given whole)
    (note,) = info.value.__notes__
    assert "its graph's input, a list of 2: every root receives the whole input" in note
    assert "a DataLoader batch (inputs, targets), give the graph its inputs alone" in note
    assert g.forward(1) == 2  # (its inputs alone: run)
