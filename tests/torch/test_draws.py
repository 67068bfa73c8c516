"""A cached node that draws random numbers in its forward (``somatize/torch/draws.py``):
its remembered output freezes one draw, where plain PyTorch draws anew at every call."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque, Recorder
from somatize.torch import draws


class Noisy(Node):
    """A backbone with its augmentation inside it: fresh noise at every call."""

    def __init__(self) -> None:
        self.lin = nn.Linear(3, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x + 0.1 * torch.randn_like(x))))


class Dropping(Node):
    """Row-wise and trainable, with dropout: in training mode its rows are random."""

    rowwise = True

    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))

    def forward(self, x, ctx):
        with torch.no_grad():
            return Done(self.net(x))


class Plain(Node):
    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))  # frozen: eval, no draw

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


@pytest.fixture(autouse=True)
def _each_test_warns_afresh():
    draws._warned.clear()  # (once per node and class in a process)


def graph(node: Node, per: str, freeze: bool = True) -> Graph:
    g = Graph(keeper=MemoryKeeper()).node("enc", node)
    if freeze:
        g.freeze("enc")
    g.cache("enc", per=per)
    st.module(g)
    return g


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_cached_node_drawing_random_numbers_warns_naming_it(per):
    g = graph(Noisy(), per)
    with pytest.warns(UserWarning, match=r"node 'enc' \(Noisy\) is cached but drew random"):
        g.forward(torch.ones(4, 3))


def test_dropout_in_training_mode_in_a_row_wise_node_warns():
    g = graph(Dropping(), "example", freeze=False)
    st.module(g).train()
    with pytest.warns(UserWarning, match=r"node 'enc' \(Dropping\) .*drew random.*dropout"):
        g.forward(torch.ones(4, 3))


def test_a_frozen_node_with_dropout_draws_nothing_and_does_not_warn():
    g = graph(Plain(), "example")
    st.module(g).train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.forward(torch.ones(4, 3))
        g.forward(torch.ones(4, 3))


class Jitter(Node):
    """Augments with Python's and numpy's global generators (as albumentations does)."""

    def __init__(self, draw) -> None:
        self.draw = draw

    def forward(self, x, ctx):
        return Done(x * self.draw())


@pytest.mark.filterwarnings("ignore:node class .* which enters its key by type alone")
@pytest.mark.parametrize("which", ["random", "numpy"])
def test_a_draw_from_pythons_or_numpys_global_generator_warns_too(which):
    import random

    import numpy as np

    draw = random.random if which == "random" else (lambda: np.random.rand())
    g = graph(Jitter(draw), "batch", freeze=False)
    with pytest.warns(UserWarning, match=r"node 'enc' \(Jitter\) is cached but drew random"):
        g.forward(torch.ones(4, 3))


class OwnGenerator(Node):
    """Augments with a generator of its own (``np.random.default_rng(0)``, ``random.Random``):
    each call draws anew, as a held ``torch.Generator`` does."""

    def __init__(self, which: str) -> None:
        import random

        import numpy as np

        self.which = which
        self.rng: object = {
            "numpy": np.random.default_rng(0),
            "numpy-legacy": np.random.RandomState(0),
            "random": random.Random(0),
        }[which]
        self.lin = nn.Linear(3, 3)

    def forward(self, x, ctx):
        draw = self.rng.random() if self.which != "numpy-legacy" else self.rng.rand()
        return Done(Opaque(self.lin(x + float(draw))))


@pytest.mark.parametrize("per", ["example", "batch"])
@pytest.mark.parametrize("which", ["numpy", "numpy-legacy", "random"])
def test_a_node_drawing_from_a_generator_it_holds_draws_anew_at_each_call(which, per):
    torch.manual_seed(0)
    g = graph(OwnGenerator(which), per)
    first, second = g.forward(torch.ones(4, 3)), g.forward(torch.ones(4, 3))
    assert not torch.equal(first, second)  # as in plain PyTorch: not the first draw again
    torch.manual_seed(0)
    again = graph(OwnGenerator(which), per)  # seeded alike: the same draws, found
    again.keeper = g.keeper
    rec = Recorder()
    again.watchers.append(rec)
    assert torch.equal(again.forward(torch.ones(4, 3)), first)
    missed = [e for e in rec.events if type(e).__name__ == "CacheMiss" or getattr(e, "misses", 0)]
    assert not missed


class Augment(nn.Module):
    """A module of one's own that augments with a numpy generator it holds."""

    def __init__(self) -> None:
        super().__init__()
        import numpy as np

        self.rng = np.random.default_rng(0)
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x + float(self.rng.random()))


class Holds(Node):
    def __init__(self) -> None:
        self.net = Augment()

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_module_drawing_from_a_generator_it_holds_draws_anew_at_each_call(per):
    g = graph(Holds(), per)
    assert not torch.equal(g.forward(torch.ones(4, 3)), g.forward(torch.ones(4, 3)))


def test_pythons_global_generator_is_read_where_it_lies_and_every_draw_is_seen():
    import random

    assert draws._random_layout(random._inst) is not None  # CPython: no getstate() per read
    before = draws._python()
    for _ in range(624):  # one full turn: the position is back, the state regenerated
        random.getrandbits(32)
    assert draws._python()[1] == before[1]
    assert draws._python() != before
    random.gauss(0, 1)
    held = draws._python()
    random.gauss(0, 1)  # the second gauss draws no word: it returns the one held
    assert draws._python() != held


def test_numpys_generators_swapped_in_are_not_kept():
    np = pytest.importorskip("numpy")
    before = np.random.get_bit_generator()
    try:
        seen = []
        for seed in range(5):
            np.random.set_bit_generator(np.random.MT19937(seed))
            seen.append(draws._numpy(np))
        # before: one entry, holding its generator, for every generator ever swapped in
        assert len(draws._numpy_states) == 1
        assert all(a != b for a, b in itertools.pairwise(seen))  # a swap reads as a change
    finally:
        np.random.set_bit_generator(before)
