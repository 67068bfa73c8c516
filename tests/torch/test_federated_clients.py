"""Client side: FedProx and SCAFFOLD against hand-written steps, alone, with closures and in
the Trainer."""

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Graph
from somatize.errors import AggregationError
from somatize.torch import federated as fl
from tests.torch.federated_helpers import Linear


def make_graph(seed=0):
    torch.manual_seed(seed)
    return Graph.somatize(Linear(4, 3))


GEN = torch.Generator().manual_seed(0)
BATCHES = [
    (torch.randn(8, 4, generator=GEN), torch.randint(0, 3, (8,), generator=GEN)) for _ in range(5)
]


def moved(model):
    """The model after the client moved away from the global weights (so the term matters)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3)
    return model


@pytest.mark.parametrize(
    "make_opt",
    [lambda ps: torch.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.Adam(ps, lr=0.05)],
    ids=["sgd", "adam"],
)
def test_prox_equals_a_hand_written_fedprox_loss(make_opt):
    mu = 0.5
    torch.manual_seed(0)
    ours, theirs = nn.Linear(4, 3), nn.Linear(4, 3)
    theirs.load_state_dict(ours.state_dict())
    anchor = [p.detach().clone() for p in theirs.parameters()]
    opt_ours = fl.prox(make_opt, mu=mu)(list(ours.parameters()))
    opt_theirs = make_opt(list(theirs.parameters()))
    moved(ours), moved(theirs)
    for x, y in BATCHES:
        opt_ours.zero_grad()
        nn.functional.cross_entropy(ours(x), y).backward()
        opt_ours.step()
        opt_theirs.zero_grad()  # FedProx as Li et al. write it: the proximal term in the loss
        prox_term = sum((p - a).pow(2).sum() for p, a in zip(theirs.parameters(), anchor))
        (nn.functional.cross_entropy(theirs(x), y) + mu / 2 * prox_term).backward()
        opt_theirs.step()
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)


CLOSURE_OPTIMIZERS = [
    lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=4),
    lambda ps: torch.optim.LBFGS(ps, lr=1, max_iter=4, line_search_fn="strong_wolfe"),
    lambda ps: torch.optim.SGD(ps, lr=0.1),  # as Lightning steps it: with a closure
]
CLOSURE_IDS = ["lbfgs", "lbfgs-wolfe", "sgd-closure"]


def _closure(model, opt, x, y, extra=lambda: 0.0):
    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) + extra()
        loss.backward()
        return loss

    return closure


@pytest.mark.parametrize("make_opt", CLOSURE_OPTIMIZERS, ids=CLOSURE_IDS)
def test_prox_with_a_closure_equals_a_hand_written_fedprox_loss(make_opt):
    # LBFGS evaluates the closure many times a step: the term must be in every evaluation
    mu = 0.5
    torch.manual_seed(0)
    ours, theirs = nn.Linear(4, 3), nn.Linear(4, 3)
    theirs.load_state_dict(ours.state_dict())
    anchor = [p.detach().clone() for p in theirs.parameters()]
    opt_ours = fl.prox(make_opt, mu=mu)(list(ours.parameters()))
    opt_theirs = make_opt(list(theirs.parameters()))
    moved(ours), moved(theirs)

    def prox_term():
        return mu / 2 * sum((p - a).pow(2).sum() for p, a in zip(theirs.parameters(), anchor))

    for x, y in BATCHES:
        got = opt_ours.step(_closure(ours, opt_ours, x, y))
        want = opt_theirs.step(_closure(theirs, opt_theirs, x, y, prox_term))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # the objective's loss
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make_opt", CLOSURE_OPTIMIZERS, ids=CLOSURE_IDS)
def test_scaffold_with_a_closure_equals_a_hand_written_linear_correction(make_opt):
    g = make_graph()
    ours = st.module(g)
    theirs = nn.Linear(4, 3)
    weight, bias = ours.parameters()
    theirs.load_state_dict({"weight": weight.detach(), "bias": bias.detach()})
    gen = torch.Generator().manual_seed(1)
    c = {n: 0.1 * torch.randn(p.shape, generator=gen) for n, p in ours.named_parameters()}
    ci = {n: 0.1 * torch.randn(p.shape, generator=gen) for n, p in ours.named_parameters()}
    d = [c[n] - ci[n] for n, _ in ours.named_parameters()]
    opt_ours = fl.scaffold(make_opt, g, c, ci)(list(ours.parameters()))
    opt_theirs = make_opt(list(theirs.parameters()))

    def l2(model):  # (the user's own: bounds the objective, which a linear term alone may
        return lambda: 0.5 * sum(p.pow(2).sum() for p in model.parameters())  # not be)

    def linear():  # ⟨c − cᵢ, w⟩: its gradient is SCAFFOLD's correction
        return l2(theirs)() + sum((di * p).sum() for di, p in zip(d, theirs.parameters()))

    for x, y in BATCHES:
        opt_ours.step(_closure(ours, opt_ours, x, y, l2(ours)))
        opt_theirs.step(_closure(theirs, opt_theirs, x, y, linear))
        for a, b in zip(ours.parameters(), theirs.parameters()):  # (the losses differ by a
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # constant, rounded)


def test_prox_in_the_trainer_pulls_the_client_towards_the_global_state():
    distance = {}
    for mu in (0.0, 1.0):
        g = make_graph()
        start = st.state(g)
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=fl.prox(lambda ps: torch.optim.SGD(ps, lr=0.5), mu=mu),
            epochs=5,
            seed=0,
            options=st.Options(progress=False),
        )
        end = trainer.fit(g, BATCHES).state
        distance[mu] = sum(float((end[k] - start[k]).norm()) for k in start)
    assert distance[1.0] < 0.8 * distance[0.0]
    with pytest.raises(ValueError, match="mu must be a non-negative"):
        fl.prox(lambda ps: torch.optim.SGD(ps, lr=0.1), mu=-1)


def test_scaffold_adds_c_minus_c_client_and_option_two_variates():
    lr = 0.1
    g, ref = make_graph(), nn.Linear(4, 3)
    ref.load_state_dict({k.split("lin.")[1]: v for k, v in st.state(g).items()})
    gen = torch.Generator().manual_seed(1)
    c = {k: torch.randn(v.shape, generator=gen) for k, v in fl.variates(g).items()}
    ci = {k: torch.randn(v.shape, generator=gen) for k, v in c.items()}
    start = st.state(g)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=fl.scaffold(lambda ps: torch.optim.SGD(ps, lr=lr), g, c, ci),
        epochs=1,
        seed=0,
        options=st.Options(progress=False, shuffle=False),
    )
    result = trainer.fit(g, BATCHES)
    corr = {"weight": c["linear.lin.weight"] - ci["linear.lin.weight"]}
    corr["bias"] = c["linear.lin.bias"] - ci["linear.lin.bias"]
    for x, y in BATCHES:  # SCAFFOLD's local step, by hand: y ← y − η (g(y) − cᵢ + c)
        ref.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                p -= lr * (p.grad + corr[name])
    for name, p in ref.named_parameters():
        torch.testing.assert_close(result.state[f"linear.lin.{name}"], p.detach())
    new = fl.control_variate(start, result, c, ci, lr=lr)
    k = "linear.lin.weight"
    expected = ci[k] - c[k] + (start[k] - result.state[k]) / (len(BATCHES) * lr)
    torch.testing.assert_close(new[k], expected)
    server = fl.server_variate(c, [{n: new[n] - ci[n] for n in c}], clients=4)
    torch.testing.assert_close(server[k], c[k] + (new[k] - ci[k]) / 4)
    with pytest.raises(AggregationError, match=r"no entry for \['linear.lin.bias'\]"):
        fl.scaffold(lambda ps: torch.optim.SGD(ps, lr=lr), g, {k: c[k]}, ci)


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
def test_a_fedavg_round_through_the_trainer_is_a_hand_written_one_in_the_documented_order(shuffle):
    """docs/federated.md: a list of batches is read in the permutation drawn from
    (seed, epoch) under the default Options(shuffle=True), in its own order with False."""
    clients = [BATCHES[:3], BATCHES[2:]]
    global_state = st.state(make_graph())
    results, plain, orders = [], [], []
    for c, batches in enumerate(clients):
        g = make_graph()
        st.load_state(g, global_state)
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            seed=1000 + c,
            options=st.Options(progress=False, shuffle=shuffle),
        )
        results.append(trainer.fit(g, batches))
        ref = nn.Linear(4, 3)  # the same client, by hand
        ref.load_state_dict({k.split("lin.")[1]: v for k, v in global_state.items()})
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for e in range(2):
            gen = torch.Generator().manual_seed((1000 + c) * 1_000_003 + e)
            order = torch.randperm(len(batches), generator=gen) if shuffle else range(len(batches))
            orders.append([int(i) for i in order])
            for i in order:
                x, y = batches[i]
                opt.zero_grad()
                nn.functional.cross_entropy(ref(x), y).backward()
                opt.step()
        plain.append({f"linear.lin.{k}": v for k, v in ref.state_dict().items()})
    ours = st.fedavg(results)
    theirs = st.fedavg(plain, weights=[r.num_examples for r in results])
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert any(o != sorted(o) for o in orders) == shuffle  # (the order did matter)
