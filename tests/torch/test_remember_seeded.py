"""A remembered function that seeds torch's global generator, as docs/federated.md advises
(``torch.default_generator.manual_seed(seed)``), is keyed by that code, not by where the
global generator stood when it was called: a rerun whose earlier clients are recalled (and
so draw nothing) recalls the later ones too."""

from __future__ import annotations

import torch
from torch import nn

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque
from somatize.torch import federated as fl


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def make_graph(seed=0):
    torch.default_generator.manual_seed(seed)  # (draws the initial weights)
    return Graph.somatize(Linear())


def client(global_state, task):
    x, y, seed = task
    g = make_graph()
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=1,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, list(zip(x.split(4), y.split(4))))


OWN = torch.Generator().manual_seed(0)


def draws_from_its_own(n):
    return torch.randn(n, generator=OWN)


def tasks():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 4, generator=gen), torch.randint(0, 3, (24,), generator=gen)
    return [(x[c::3], y[c::3], c) for c in range(3)]


def test_the_key_does_not_follow_the_global_generators_state(tmp_path):
    train = st.remember(client, keeper=DiskKeeper(tmp_path))
    state, task = st.state(make_graph(1)), tasks()[0]
    key = train.key(state, task)
    torch.randn(5)  # the global generator moves on
    assert train.key(state, task) == key
    torch.default_generator.manual_seed(123)
    assert train.key(state, task) == key


def test_a_rerun_recalls_every_client_after_a_recalled_one(tmp_path):
    """Before: the second pass recalled clients 0 and 2 only. Client 0's run had seeded and
    drawn from the global generator; recalled, it draws nothing, so client 1's key (which
    held the generator's state) was not the one its run was stored under."""
    train = st.remember(client, keeper=DiskKeeper(tmp_path))
    passes = []
    for _ in range(2):
        state = st.state(make_graph(1))  # the loop's own initial weights, seed 1
        passes.append(fl.map_clients(None, train, tasks(), shared=state))
    assert [r.recalled for r in passes[0]] == [False] * 3
    assert [r.recalled for r in passes[1]] == [True] * 3
    for a, b in zip(*passes):
        assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)


def test_a_generator_of_the_users_own_still_enters_by_its_state(tmp_path):
    draw = st.remember(draws_from_its_own, keeper=DiskKeeper(tmp_path))
    key = draw.key(3)
    torch.randn(3, generator=OWN)
    assert draw.key(3) != key  # its next draw is another: not recalled
