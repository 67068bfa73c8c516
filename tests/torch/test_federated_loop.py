"""A whole federated loop against the same loop in plain PyTorch, round by round:
Dirichlet-skewed clients of uneven sizes, a sample per round, shuffled local epochs, a
client that fails and is dropped, and FedAvgM on the server (the walkthrough of a student's
digits experiment, docs/federated.md, at test size)."""

from __future__ import annotations

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.torch import federated as fl

LR, EPOCHS, BATCH = 0.1, 2, 8


class Dense(Node):
    def __init__(self, i, o, relu=True):
        self.lin, self.relu = nn.Linear(i, o), relu

    def forward(self, x, ctx):
        h = self.lin(x)
        return Done(Opaque(torch.relu(h) if self.relu else h))


def make_graph(seed=0):
    torch.default_generator.manual_seed(seed)
    return Graph.somatize(Dense(6, 8) >> Dense(8, 3, relu=False))


def plain_model(seed=0):  # the same layers, drawn in the same order
    torch.default_generator.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def client(global_state, task):
    x, y, seed, fails = task
    if fails:
        raise RuntimeError("this client lost its connection")
    g = make_graph()
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
        epochs=EPOCHS,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, list(zip(x.split(BATCH), y.split(BATCH))))


def plain_client(global_state, x, y, seed):
    m = plain_model()
    m.load_state_dict(global_state)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    batches = list(zip(x.split(BATCH), y.split(BATCH)))
    for e in range(EPOCHS):  # the order federated.md documents for a list of batches
        gen = torch.Generator().manual_seed(seed * 1_000_003 + e)
        for i in torch.randperm(len(batches), generator=gen).tolist():
            opt.zero_grad()
            nn.functional.cross_entropy(m(batches[i][0]), batches[i][1]).backward()
            opt.step()
    return m.state_dict()


def data():
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (300,), generator=gen)
    x = torch.randn(300, 6, generator=gen) + y[:, None].float()
    return x, y, fl.dirichlet(y, clients=10, alpha=0.5, seed=0)


ROUNDS, FAILS = 5, (2, 0)  # (round, the index in that round's sample) of the failing client


def test_a_federated_loop_matches_plain_pytorch_round_by_round():
    """The first round's clients train bitwise as the plain ones do. The aggregate is within half a unit
    in the last place of the exact weighted mean, as a float64 mean cast to float32 is; at an
    exact tie the two may round to either neighbour (and the next round's clients start a
    float32 ulp apart), so the rounds are compared to 1e-6 — weights of order 1, a few
    float32 ulps after FedAvgM's momentum —, not bitwise."""
    x, y, parts = data()
    assert len({len(p) for p in parts}) > 3  # uneven sizes: the weights matter
    server, state = fl.FedAvgM(lr=1.0, momentum=0.5), st.state(make_graph(1))
    plain = plain_model(1).state_dict()
    names = dict(zip(state, plain))  # somatize's key -> nn.Sequential's, by position
    v: dict[str, torch.Tensor] = {}
    dropped = 0
    for r in range(ROUNDS):
        chosen = fl.sample(len(parts), fraction=0.5, round=r, seed=0)
        fails = [(r, i) == FAILS for i in range(len(chosen))]
        tasks = [(x[parts[c]], y[parts[c]], 100 * r + c, f) for c, f in zip(chosen, fails)]
        results = fl.map_clients(None, client, tasks, shared=state, errors="return")
        done = [res for res in results if not isinstance(res, fl.ClientFailure)]
        dropped += len(results) - len(done)
        state = server.step(state, st.fedavg(done))
        # by hand
        kept = [(c, t) for c, t, f in zip(chosen, tasks, fails) if not f]
        trained = [(plain_client(plain, t[0], t[1], t[2]), len(parts[c])) for c, t in kept]
        total = sum(n for _, n in trained)
        for k in plain:
            mean = sum(s[k].double() * n for s, n in trained) / total
            v[k] = 0.5 * v.get(k, 0) + (mean - plain[k].double())
        plain = {k: (plain[k].double() + v[k]).float() for k in plain}
        if r == 0:  # from the same global state, the clients train bitwise as by hand
            for (res, (c, _)), (s, _) in zip(zip(done, kept), trained):
                assert all(torch.equal(res.state[k], s[names[k]]) for k in res.state), c
        for k in state:
            torch.testing.assert_close(state[k], plain[names[k]], rtol=0, atol=1e-6)
    assert dropped == 1
    assert any(not torch.equal(state[k], plain_model(1).state_dict()[names[k]]) for k in state)
