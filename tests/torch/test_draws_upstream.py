"""A node drawing random numbers upstream of a node cached whole (``somatize/drawn.py``): it
is keyed by the content of its output, so the cached node below serves what it receives —
test-time augmentation gives a new draw at every pass, as without the cache."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import CacheError, Done, Graph, MemoryKeeper, Node, Opaque, Recorder, digest
from somatize.transports import InProcess
from somatize.watchers import CacheHit, CacheMiss


class Jitter(Node):
    """Test-time augmentation: noise from torch's global generator."""

    def forward(self, x, ctx):
        return Done(x + 0.5 * torch.randn_like(x))


class Scale(Node):
    """A deterministic step before the encoder."""

    def forward(self, x, ctx):
        return Done(x * 2)


class Enc(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.out(x)))


def graph(first: Node, cached: bool = True, per: str = "batch", rec: Recorder | None = None):
    torch.manual_seed(0)  # (the same encoder weights in every graph)
    g = Graph.somatize(first.with_id("aug") >> Enc().with_id("enc"), keeper=MemoryKeeper())
    g.freeze("enc")
    if cached:
        g.cache("enc", per=per)
    if rec is not None:
        g.watchers.append(rec)
    st.module(g)
    return g


def counts(rec: Recorder) -> tuple[int, int]:
    hits = sum(isinstance(e, CacheHit) for e in rec.events)
    return hits, sum(isinstance(e, CacheMiss) for e in rec.events)


X = torch.arange(12.0).reshape(3, 4)


def test_test_time_augmentation_draws_anew_at_each_pass_as_without_the_cache():
    cached, plain = graph(Jitter()), graph(Jitter(), cached=False)
    passes = []
    for seed in range(5):
        torch.manual_seed(seed)
        got = cached.forward(X)
        torch.manual_seed(seed)
        assert torch.equal(got, plain.forward(X))  # each pass: what uncached gives
        passes.append(got)
    assert all(not torch.equal(passes[0], p) for p in passes[1:])
    torch.manual_seed(3)  # a draw seen before: its content, found
    rec = Recorder()
    cached.watchers.append(rec)
    assert torch.equal(cached.forward(X), passes[3])
    assert counts(rec) == (1, 0)


def test_a_deterministic_node_upstream_keeps_its_recipe_key_and_hits():
    rec = Recorder()
    g = graph(Scale(), rec=rec)
    first = g.run(X)
    assert torch.equal(g.run(X).value, first.value)
    assert counts(rec) == (1, 1)
    (key,) = {e.key for e in rec.events if isinstance(e, (CacheHit, CacheMiss))}
    assert key != g.keys.of(g["enc"], [digest(X * 2, g.codecs)])  # a recipe, not content


def test_a_draw_that_leaves_the_output_as_it_was_still_hits():
    class MaybeFlip(Node):  # a random transform that happened to change nothing
        def forward(self, x, ctx):
            torch.rand(())
            return Done(x)

    rec = Recorder()
    g = graph(MaybeFlip(), rec=rec)
    g.forward(X)
    g.forward(X)
    assert counts(rec) == (1, 1)


@pytest.mark.filterwarnings("ignore:node class .* which enters its key by type alone")
@pytest.mark.parametrize("which", ["random", "numpy", "gauss"])
def test_draws_from_pythons_and_numpys_global_generators_are_seen(which):
    random.gauss(0, 1)  # (the second gauss draws nothing: it returns the one held)
    draw = {
        "random": random.random,
        "numpy": lambda: float(np.random.rand()),
        "gauss": lambda: random.gauss(0, 1),
    }[which]

    class Shift(Node):
        def forward(self, x, ctx):
            return Done(x + draw())

    rec = Recorder()
    g = graph(Shift(), rec=rec)
    assert not torch.equal(g.forward(X), g.forward(X))
    assert counts(rec) == (0, 2)


class OwnGenerator(Node):
    """Augments with a generator it holds: its state is in its key already."""

    def __init__(self) -> None:
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x, ctx):
        return Done(x + torch.randn(x.shape, generator=self.gen))


def test_a_generator_the_node_holds_keeps_its_recipe_key_moving_with_each_draw():
    rec = Recorder()
    g = graph(OwnGenerator(), rec=rec)
    first, second = g.forward(X), g.forward(X)
    assert not torch.equal(first, second)
    g["aug"].gen.manual_seed(0)  # seeded again: the first draw again, found by its recipe
    assert torch.equal(g.forward(X), first)
    assert counts(rec) == (1, 2)
    assert g.program().watched == {"aug"}  # (watched, but it draws from no global one)


def test_an_opaque_output_holding_data_is_keyed_by_its_content():
    class OpaqueJitter(Node):
        def forward(self, x, ctx):
            return Done(Opaque(x + torch.randn_like(x)))

    g = Graph.somatize(
        OpaqueJitter().with_id("aug") >> Scale().with_id("mid") >> Enc().with_id("enc")
    )
    g.freeze("enc").cache("enc")
    st.module(g)
    assert not torch.equal(g.forward(X), g.forward(X))


def test_an_opaque_output_that_is_not_data_is_refused_naming_the_node():
    class Learned(Node):  # trainable: its output requires grad
        def __init__(self) -> None:
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x, ctx):
            return Done(Opaque(x * self.w + torch.randn_like(x)))

    class Detach(Node):
        def forward(self, x, ctx):
            return Done(x.detach())

    g = Graph.somatize(Learned().with_id("aug") >> Detach().with_id("d") >> Enc().with_id("enc"))
    g.freeze("enc").cache("enc")
    st.module(g)
    with pytest.raises(CacheError, match=r"node 'aug' drew random numbers .* not data"):
        g.forward(X)


def test_only_nodes_keying_a_node_cached_whole_or_named_are_watched():
    assert graph(Jitter()).program().watched == {"aug"}
    assert graph(Jitter(), per="example").program().watched == frozenset()  # rows: content
    assert graph(Jitter(), cached=False).program().watched == frozenset()
    named = graph(Jitter(), cached=False)
    named.name("aug", "augmented")
    assert named.program().watched == {"aug"}  # a named node's own key


def test_a_named_node_that_draws_is_recorded_under_the_content_of_its_output():
    g = Graph().node("aug", Jitter()).name("aug", "augmented")
    st.module(g)
    first, second = g.run(X), g.run(X)
    assert first.key == digest(first.value, g.codecs) != second.key


def test_a_subgraph_node_that_draws_inside_is_keyed_by_its_output():
    sub = Graph.somatize(Scale().with_id("s") >> Jitter().with_id("j"))
    g = Graph().node("aug", sub).node("enc", Enc()).edge("aug", "enc")
    g.freeze("enc").cache("enc")
    st.module(g)
    assert not torch.equal(g.forward(X), g.forward(X))


def test_a_node_drawing_on_this_host_keys_a_node_cached_on_another_by_its_output():
    g = graph(Jitter())
    g.place("enc", host="box")
    box = {"box": InProcess(MemoryKeeper())}
    assert not torch.equal(g.forward(X, transports=box), g.forward(X, transports=box))


def test_a_fit_with_jitter_before_the_cached_encoder_serves_each_epoch_its_draws():
    torch.manual_seed(0)
    g = Graph.somatize(Jitter().with_id("aug") >> Enc().with_id("enc") >> Head())
    g.freeze("enc").cache("enc")
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))), 8)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=st.Options(shuffle=False, progress=False),
    )
    with pytest.warns(RuntimeWarning, match=r"node 'enc' is cached, but none of its 4 lookups"):
        result = trainer.fit(g, data)
    assert result.cache == {"enc": {"hits": 0, "misses": 8}}  # a new draw each epoch
