"""Found by replicating papers with somatize.torch.federated: SCAFFOLD on a model with a frozen
layer, trimmed means that trim nothing, numpy hyper-parameters."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.torch import federated as fl


class TwoLayers(Node):
    def __init__(self):
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.b(torch.tanh(self.a(x)))))


GEN = torch.Generator().manual_seed(0)
BATCHES = [
    (torch.randn(8, 4, generator=GEN), torch.randint(0, 3, (8,), generator=GEN)) for _ in range(4)
]


def test_scaffold_on_a_graph_with_a_frozen_layer_equals_hand_written_steps():
    """fl.variates(g) leaves a frozen parameter out, so scaffold must not ask for it (it
    refused, saying to start from fl.variates(g), which is what the loop did)."""
    torch.manual_seed(0)
    g = Graph.somatize(TwoLayers())
    st.module(g).two_layers.a.weight.requires_grad_(False)  # a frozen (pretrained) weight
    c = {k: 0.1 * torch.randn(v.shape, generator=GEN) for k, v in fl.variates(g).items()}
    ci = {k: 0.1 * torch.randn(v.shape, generator=GEN) for k, v in c.items()}
    assert "two_layers.a.weight" not in c
    start = st.state(g)
    ref = TwoLayers()
    for name, p in ref.a.named_parameters():
        p.data.copy_(start[f"two_layers.a.{name}"])
    for name, p in ref.b.named_parameters():
        p.data.copy_(start[f"two_layers.b.{name}"])
    lr = 0.1
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=fl.scaffold(lambda ps: torch.optim.SGD(ps, lr=lr), g, c, ci),
        epochs=1,
        seed=0,
        options=st.Options(progress=False, shuffle=False),
    )
    result = trainer.fit(g, BATCHES)
    params = {f"two_layers.{m}.{n}": p for m in "ab" for n, p in getattr(ref, m).named_parameters()}
    for x, y in BATCHES:  # y ← y − η (g(y) − cᵢ + c), the frozen weight left alone
        for p in params.values():
            p.grad = None
        nn.functional.cross_entropy(ref.b(torch.tanh(ref.a(x))), y).backward()
        with torch.no_grad():
            for k, p in params.items():
                if k in c:
                    p -= lr * (p.grad + c[k] - ci[k])
    for k, p in params.items():
        torch.testing.assert_close(result.state[k], p.detach())
    assert torch.equal(result.state["two_layers.a.weight"], start["two_layers.a.weight"])
    new = fl.control_variate(start, result, c, ci, lr=lr)
    assert set(new) == set(c)


def test_trimmed_mean_that_trims_nothing_warns_naming_the_beta_that_would():
    """beta=0.1 over 5 clients cuts int(0.5) = 0 values: the plain mean, dragged by the
    attacker, without a word (as Flower and scipy cut; now it says so)."""
    states = [{"w": torch.tensor([float(v)])} for v in (1, 2, 3, 4, 100)]
    with pytest.warns(UserWarning, match=r"trims int\(0.1 × 5\) = 0 .* beta ≥ 1/5 = 0.2"):
        dragged = fl.trimmed_mean(states, 0.1)
    assert float(dragged["w"]) == 22.0  # the mean, as before: only the warning is new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(fl.trimmed_mean(states, 0.2)["w"]) == 3.0  # trims one at each end
        assert float(fl.trimmed_mean(states, 0.0)["w"]) == 22.0  # asked for no trimming


def test_numpy_scalars_are_taken_where_python_numbers_are():
    """A sweep over np.arange/np.float32 values: each was refused as 'not a non-negative
    int/number', though it is one (fl.sample and DPFedAvg took them already)."""
    states = [{"w": torch.tensor([float(v)])} for v in (1.0, 1.1, 0.9, 1.2, 1.05, 1.15, 50.0)]
    for f in np.arange(2):
        assert torch.equal(
            fl.krum(states, attackers=f)["w"], fl.krum(states, attackers=int(f))["w"]
        )
    assert fl.multi_krum(states, attackers=np.int64(1), keep=np.int64(2)).selected == (
        fl.multi_krum(states, attackers=1, keep=2).selected
    )
    assert torch.equal(fl.bulyan(states, attackers=np.int64(1))["w"], fl.bulyan(states, 1)["w"])
    labels = np.arange(90) % 3
    assert fl.dirichlet(labels, clients=np.int64(3), alpha=0.5, min_size=np.int64(2)) == (
        fl.dirichlet(labels, clients=3, alpha=0.5, min_size=2)
    )
    assert fl.shards(labels, clients=np.int64(3), per_client=np.int64(2)) == fl.shards(labels, 3)
    assert fl.iid(90, clients=np.int64(4)) == fl.iid(90, clients=4)
    w = nn.Parameter(torch.tensor([3.0]))
    opt = fl.prox(lambda ps: torch.optim.SGD(ps, lr=0.5), mu=np.float32(1.0))([w])
    w.grad = torch.zeros(1)
    opt.step()  # w0 = 3, so the proximal pull is 0
    assert float(w.detach()) == 3.0
    x, a = {"w": torch.zeros(3)}, {"w": torch.ones(3)}
    theirs = fl.FedYogi(lr=np.float32(0.1), beta1=np.float32(0.9), tau=np.float64(1e-3))
    ours = fl.FedYogi(lr=float(np.float32(0.1)), beta1=float(np.float32(0.9)), tau=1e-3)
    assert torch.equal(theirs.step(x, a)["w"], ours.step(x, a)["w"])
    assert type(theirs.state_dict()["lr"]) is float  # torch.load(weights_only=True) takes it
    for bad in (True, "0.1", -1.0):
        with pytest.raises(ValueError, match="lr must be a positive finite number"):
            fl.FedAdam(lr=bad)
    with pytest.raises(ValueError, match="attackers must be a non-negative int, not 1.5"):
        fl.krum(states, attackers=1.5)


def test_poisson_sampling_is_what_dpfedavg_accountant_charges_and_does_not_warn():
    """DP-FedAvg's accountant analyses Poisson sampling; the loop had to write it by hand
    (np.flatnonzero(rng.random(N) < q)) and silence the over-count warning every round."""
    from opacus.accountants import RDPAccountant

    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=50, per_round=5, poisson=True, seed=0)
    x, sizes = {"w": torch.zeros(4)}, []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rounds of more than per_round=5 do not warn
        for r in range(40):
            chosen = fl.sample(50, rate=dp.sample_rate, round=r, seed=3)
            assert chosen == fl.sample(50, rate=0.1, round=r, seed=3)  # by (seed, round) alone
            assert chosen == sorted(set(chosen)) and all(0 <= c < 50 for c in chosen)
            sizes.append(len(chosen))
            x = dp.step(x, [{"w": x["w"] + 0.1} for _ in chosen])
    assert max(sizes) > 5 and dp.rounds == 40
    ref = RDPAccountant()
    for _ in range(40):
        ref.step(noise_multiplier=1.0, sample_rate=0.1)
    assert dp.epsilon(1e-5) == ref.get_epsilon(1e-5)
    # each client independently at the rate: over many rounds, every client near it
    drawn = np.zeros(50)
    for r in range(2000):
        drawn[fl.sample(50, rate=0.1, round=r, seed=0)] += 1
    assert np.abs(drawn / 2000 - 0.1).max() < 0.035  # (4.9 standard deviations of 2000 draws)
    assert any(not fl.sample(50, rate=0.02, round=r) for r in range(50))  # a round of nobody
    with pytest.warns(UserWarning, match=r"pass poisson=True"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=50, per_round=5).step(
            {"w": torch.zeros(1)}, [{"w": torch.ones(1)}] * 6
        )
    with pytest.raises(ValueError, match="exactly one of fraction=.*rate="):
        fl.sample(50, count=5, rate=0.1, round=0)
    with pytest.raises(ValueError, match=r"rate must be a probability in \(0, 1\], not 1.5"):
        fl.sample(50, rate=1.5, round=0)
    with pytest.raises(ValueError, match="weights= goes with fraction= or count="):
        fl.sample(50, rate=0.1, round=0, weights=[1.0] * 50)
    with pytest.raises(ValueError, match="poisson=True .* takes no weights="):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=2, per_round=1, poisson=True, weights=[1, 2])
