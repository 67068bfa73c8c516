"""Pick(k): one of the graph's inputs (a position, or a key of a dict batch)."""

from __future__ import annotations

import pytest

from somatize import CacheError, Done, Graph, Node, Opaque, Pick, Recorder
from somatize.watchers import CacheHit, CacheMiss


class Upper(Node):
    def forward(self, x, ctx):
        return Done(x.upper())


class Seen(Node):
    """Records what it received, by identity."""

    def __init__(self):
        self.got = []

    def forward(self, x, ctx):
        self.got.append(x)
        return Done(Opaque(x))


def test_picks_a_position_or_a_key_and_counts_from_the_end():
    assert Graph.somatize(Pick(0)).forward("a", "b", "c") == "a"
    assert Graph.somatize(Pick(-1)).forward("a", "b", "c") == "c"
    assert Graph.somatize(Pick("text")).forward({"image": 1, "text": "hi"}) == "hi"
    assert Graph.somatize(Pick(1)).forward(("x", "y")) == "y"  # one tuple input: its parts


def test_each_tower_gets_its_own_input():
    g = Graph.somatize((Pick(0) >> Upper().with_id("a")) | (Pick(1) >> Upper().with_id("b")))
    assert g.forward("left", "right") == ("LEFT", "RIGHT")


def test_a_cached_node_after_a_pick_is_keyed_by_its_input_alone():
    # a root reading inputs[1] itself is keyed by every input: another first input misses
    rec = Recorder()
    g = Graph.somatize((Pick(0) >> Upper().with_id("a")) | (Pick(1) >> Upper().with_id("b")),
                       watchers=[rec]).cache("b")  # fmt: skip
    g.forward("one", "text")
    g.forward("two", "text")  # the other input changed, b's did not
    assert [e.node for e in rec.of(CacheMiss)] == ["b"]
    assert [e.node for e in rec.of(CacheHit)] == ["b"]


def test_what_requires_grad_stays_opaque_and_passes_by_identity():
    class Grad:  # (duck-typed, as the core does not import torch)
        requires_grad = True

    seen = Seen()
    x, y = Grad(), "data"
    g = Graph.somatize((Pick(0) >> seen) | (Pick(1) >> Upper()))
    out = g.forward(Opaque(x), y)
    assert seen.got == [x] and seen.got[0] is x and out[1] == "DATA"


@pytest.mark.parametrize(
    ("pick", "args", "error", "match"),
    [
        (Pick(2), ("a", "b"), IndexError, r"Pick\(2\) got 2 inputs; pick 0 to 1"),
        (Pick("z"), ({"x": 1, "y": 2},), KeyError, r"Pick\('z'\) got a dict without 'z'.*'x', 'y'"),
        (Pick("x", "w"), ({"x": 1},), KeyError, r"Pick\('x', 'w'\) got a dict without 'w'"),
        (Pick(0), (5,), TypeError, r"Pick\(0\) got one int, nothing to index"),
        (Pick("x"), (("a", "b"),), TypeError, r"str keys need a dict batch"),
        (Pick(0, 5), ("a", "b"), IndexError, r"Pick\(0, 5\) got 2 inputs"),
    ],
)
def test_a_pick_that_does_not_fit_its_input_names_what_it_got(pick, args, error, match):
    with pytest.raises(error, match=match) as e:
        Graph.somatize(pick).forward(*args)
    assert any("raised by node 'pick'" in n for n in e.value.__notes__)


@pytest.mark.parametrize("keys", [(1.0,), (None,), (True,), ([0],), (), (0, "a")])
def test_pick_takes_ints_or_strs(keys):
    with pytest.raises(TypeError, match=r"Pick\(\*keys\) takes int positions or str dict keys"):
        Pick(*keys)
    with pytest.raises(TypeError, match="names a key twice"):
        Pick("a", "a")


def test_several_keys_give_a_dict_several_positions_a_tuple():
    batch = {"pixel_values": 0, "input_ids": 1, "attention_mask": 2}
    text = Graph.somatize(Pick("input_ids", "attention_mask")).forward(batch)
    assert text == {"input_ids": 1, "attention_mask": 2}
    assert Graph.somatize(Pick(2, 0)).forward("a", "b", "c") == ("c", "a")


def test_several_keys_holding_one_that_requires_grad_stay_opaque_together():
    class Grad:
        requires_grad = True

    seen = Seen()
    g, grad = Graph.somatize(Pick(0, 1) >> seen), Grad()
    g.forward(Opaque(grad), "data")
    assert seen.got[0][0] is grad  # passed by identity, not checked as data


def test_a_node_cached_whole_after_a_pick_hits_beside_an_input_that_requires_grad():
    # an Opaque input beside it made every key vanish: "has no key: the graph input is Opaque"
    class Grad:
        requires_grad = True

    rec = Recorder()
    towers = (Pick(0) >> Seen()) | (Pick(1) >> Upper().with_id("b"))
    g = Graph.somatize(towers, watchers=[rec]).cache("b")
    for _ in range(2):
        assert g.forward(Opaque(Grad()), "text")[1] == "TEXT"
    g.forward(Opaque(Grad()), "other")
    assert [e.node for e in rec.of(CacheMiss)] == ["b", "b"]
    assert [e.node for e in rec.of(CacheHit)] == ["b"]


def test_what_an_opaque_input_feeds_beside_a_pick_still_has_no_key():
    class Join(Node):
        def forward(self, x, ctx):
            return Done(str(x))

    g = Graph.somatize(((Pick(1) >> Upper()) | Seen()) >> Join().with_id("j")).cache("j")
    with pytest.raises(CacheError, match="'j' is cached but its input from node 'seen'"):
        g.forward(Opaque(object()), "text")


def test_the_input_beside_a_picked_one_is_not_hashed(monkeypatch):
    # a Pick is keyed by what it picks: hashing the whole input (the images beside the
    # texts a cached text tower reads) was work thrown away at every call
    import somatize.graph_run as graph_run

    hashed = []
    real = graph_run.digest
    monkeypatch.setattr(graph_run, "digest", lambda x, *a: hashed.append(x) or real(x, *a))
    g = Graph.somatize((Pick(0) >> Seen()) | (Pick(1) >> Upper().with_id("b"))).cache("b")
    assert g.forward("image", "text") == ("image", "TEXT")
    assert hashed == []
    whole = Graph.somatize(Upper().with_id("u")).cache("u")  # (a root that is no Pick: hashed)
    whole.forward("word")
    assert hashed == ["word"]
