"""What a cached node does that its key cannot see (``somatize/cache_warnings.py``): here, a
node cached whole whose forward writes into its input in place, told by ``g.cache``."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from somatize import Ctx, Done, Graph, Node
from somatize.cache_warnings import input_writes


class Words(Node):
    def forward(self, text: str, ctx: Ctx) -> Done:
        return Done(text.split())


class Eat(Node):  # writes into the list its sibling reads too
    def forward(self, words: list[str], ctx: Ctx) -> Done:
        words.pop()
        return Done(len(words))


class Count(Node):
    def forward(self, words: list[str], ctx: Ctx) -> Done:
        return Done(len(words))


class Both(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done(list(xs))


def test_a_cached_node_writing_its_input_is_told_at_g_cache_and_the_hazard_is_real() -> None:
    g = Graph.somatize(Words() >> (Eat() | Count()) >> Both())
    said = (
        r"node 'eat' \(Eat\) is cached but its forward writes into its input in place "
        r"\(words\.pop\(\.\.\.\)\).*words = list\(words\)"
    )
    with pytest.warns(UserWarning, match=said):
        g.cache("eat")
    # what the warning is about: the sibling sees the write after a miss, not after a hit
    assert g.forward("a b c") == [2, 2]
    assert g.forward("a b c") == [2, 3]


class SetItem(Node):
    def forward(self, row: dict[str, int], ctx: Ctx) -> Done:
        row["seen"] = 1
        return Done(row)


class Sorts(Node):
    def forward(self, words: list[str], ctx: Ctx) -> Done:
        words.sort()
        return Done(words)


class Scales(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x.mul_(2))


class Deletes(Node):
    def forward(self, row: dict[str, int], ctx: Ctx) -> Done:
        del row["a"]
        return Done(row)


@pytest.mark.parametrize(
    ("cls", "said"),
    [
        (Eat, "words.pop(...)"),
        (SetItem, "row[...] = ..."),
        (Sorts, "words.sort(...)"),
        (Scales, "x.mul_(...)"),
        (Deletes, "del row[...]"),
    ],
)
def test_each_kind_of_write_is_named_as_written(cls: type, said: str) -> None:
    assert input_writes(cls) == said


class Copies(Node):  # the input bound anew first: what it writes is its own
    def forward(self, words: list[str], ctx: Ctx) -> Done:
        words = list(words)
        words.append("<eos>")
        return Done(words)


class OutOfPlace(Node):
    def forward(self, words: list[str], ctx: Ctx) -> Done:
        return Done([*words, "<eos>"])


class TensorSort(Node):  # a tensor's sort returns its result and changes nothing
    def forward(self, x: Any, ctx: Ctx) -> Done:
        values, _ = x.sort()
        return Done(values.tolist())


class WritesItsOwn(Node):  # writing into a list of its own, made from the input
    def forward(self, words: list[str], ctx: Ctx) -> Done:
        out: list[str] = []
        out.extend(words)
        out.sort()
        return Done(out)


@pytest.mark.parametrize("cls", [Copies, OutOfPlace, TensorSort, WritesItsOwn, Count])
def test_nodes_that_leave_their_input_alone_are_not_warned_about(cls: type) -> None:
    assert input_writes(cls) == ""
    g = Graph.somatize(Words() >> cls())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.cache(g.nodes()[1])


class Appends(Node):
    def forward(self, words: list[str], ctx: Ctx) -> Done:
        words.append("<eos>")
        return Done(len(words))


def test_a_mapped_node_is_read_through_and_told_once() -> None:
    g = Graph.somatize(Words() >> Appends().with_id("each").mapped())
    with pytest.warns(UserWarning, match=r"node 'each' \(Appends\) .*words\.append"):
        g.cache("each")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.cache("each", False).cache("each")  # said once per node


def test_a_subgraph_or_turning_caching_off_is_not_read() -> None:
    inner = Graph.somatize(Eat().with_id("inner_eat"))
    g = Graph().node("block", inner).node("eat2", Eat()).edge("block", "eat2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.cache("block")
        g.cache("eat2", False)
