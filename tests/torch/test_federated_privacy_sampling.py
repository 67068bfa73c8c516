"""DP-FedAvg's rounds as sampled and charged: rounds larger than per_round, empty rounds,
weighted sampling and Poisson sampling."""

import math
import warnings

import numpy as np
import pytest
import torch

from somatize.errors import AggregationError
from somatize.torch import federated as fl
from tests.torch.privacy_rounds import GLOBAL, WEIGHTS, bn_round, round_of

pytest.importorskip("opacus")


def test_a_round_larger_than_per_round_warns_and_one_larger_than_clients_is_refused():
    # epsilon is charged at rate per_round / clients: 20 updates from a per_round=10
    # accountant (every client of a 20-client population, say) would under-report it
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=20, per_round=10)
    with pytest.warns(UserWarning, match=r"got 20 updates in one round: epsilon"):
        dp.step(GLOBAL, round_of(GLOBAL, 0.01, clients=20))
    with pytest.raises(AggregationError, match=r"clients=20\) got 21 updates"):
        dp.step(GLOBAL, round_of(GLOBAL, 0.01, clients=21))
    assert dp.rounds == 1  # the refused round charged nothing
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp.step(GLOBAL, round_of(GLOBAL, 0.01, clients=10))  # as many as planned: silent


def test_an_empty_round_adds_the_noise_alone_and_is_charged():
    # Poisson sampling (what the accountant analyses) draws nobody now and then, and a round
    # whose every client failed is empty once they are dropped; both were refused
    glob, _, buffers = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=1.3, clients=100, per_round=4, seed=5, buffers=buffers,
                     buffer_policy="unprotected_mean", poisson=True)  # fmt: skip
    out = dp.step(glob, [])
    gen = torch.Generator().manual_seed(5)  # by hand: 0 + N(0, (σC)²), over per_round
    for k, x in glob.items():
        if k in WEIGHTS:
            noise = torch.randn(x.shape, dtype=torch.float64, generator=gen)
            want = (x.double() + noise * (1.3 * 0.5) / 4).to(x.dtype)
            assert torch.equal(out[k], want)
        else:  # no client to average the buffers over, nor to count: the server's
            assert torch.equal(out[k], x)
    assert dp.rounds == 1 and dp.norms == ()
    from opacus.accountants import RDPAccountant

    ref = RDPAccountant()
    ref.step(noise_multiplier=1.3, sample_rate=4 / 100)
    assert dp.epsilon(1e-5) == ref.get_epsilon(1e-5)
    with pytest.raises(TypeError, match="aggregate a list"):
        dp.step(glob, {})  # an empty dict is not an empty round


@pytest.mark.filterwarnings(r"ignore:DPFedAvg\(per_round=2\) got \d updates")  # Poisson's spread
def test_a_poisson_loop_with_empty_rounds_charges_every_round():
    import numpy as np

    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=2, seed=0)
    x, rng, sizes = {"w": torch.zeros(4)}, np.random.default_rng(0), []
    for _ in range(30):
        chosen = np.flatnonzero(rng.random(100) < 0.02)
        sizes.append(len(chosen))
        x = dp.step(x, [{"w": x["w"] + 0.1} for _ in chosen])
    assert 0 in sizes and dp.rounds == 30
    assert sum(n for _, _, n in dp.accountant.history) == 30  # (noise, rate, rounds) entries


def test_weighted_sampling_is_charged_at_the_most_likely_clients_rate():
    # fl.sample(weights=sizes) draws the biggest of Dirichlet(0.5) clients in 16% of the
    # rounds, not m/N = 10%: charged at 10%, its epsilon was 12.8 where 7.9 was reported
    import numpy as np
    from opacus.accountants import RDPAccountant

    labels = np.random.default_rng(0).integers(0, 10, 5000)
    sizes = [len(p) for p in fl.dirichlet(labels, clients=100, alpha=0.5, seed=0)]
    big, rounds = int(np.argmax(sizes)), 2000
    q = sum(big in fl.sample(100, count=10, round=r, seed=1, weights=sizes) for r in range(rounds))
    q /= rounds
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, weights=sizes)
    uniform = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10)
    x = {"w": torch.zeros(3)}
    for r in range(100):
        chosen = fl.sample(100, count=10, round=r, seed=0, weights=sizes)
        dp.step(x, [x] * len(chosen))
        uniform.step(x, [x] * len(chosen))
    real = RDPAccountant()
    for _ in range(100):
        real.step(noise_multiplier=1.0, sample_rate=q - 4 * (q * (1 - q) / rounds) ** 0.5)
    assert uniform.sample_rate == 0.1 and q > 0.15 > dp.sample_rate - 0.02
    with pytest.warns(UserWarning, match="not a bound") as said:  # (a draw by weight)
        eps, eps_uniform = dp.epsilon(1e-5), uniform.epsilon(1e-5)
    assert len(said) == 2
    assert eps >= real.get_epsilon(1e-5) > 1.2 * eps_uniform
    equal = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, weights=[2.0] * 100)
    assert equal.sample_rate == 0.1
    with pytest.raises(ValueError, match=r"DPFedAvg\(weights=\): weights must be 100 finite"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, weights=sizes[:50])
    with pytest.raises(ValueError, match="the list of sampling weights given to fl.sample"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, weights="sizes")


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


def test_dp_sample_draws_poisson_from_a_seed_nobody_else_knows(monkeypatch):
    """The docs drew with fl.sample(rate=dp.sample_rate, seed=s), s public (0 by default):
    anyone recomputed who took part, and the amplification by sampling that epsilon counts
    on was gone (a client in 10 of 100 rounds at sigma=1: epsilon 17.9, not 7.9)."""
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, poisson=True)
    draws = [dp.sample(r) for r in range(200)]
    for seed in (0, 1, 42):  # an attacker's guesses at the seed: none of them
        assert draws[:20] != [fl.sample(100, rate=0.1, round=r, seed=seed) for r in range(20)]
    other = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, poisson=True)
    assert draws[:20] != [other.sample(r) for r in range(20)]  # a fresh secret each time
    assert all(d == sorted(set(d)) and all(0 <= c < 100 for c in d) for d in draws)
    rate = np.bincount(np.concatenate(draws).astype(int), minlength=100) / 200
    assert abs(rate.mean() - 0.1) < 0.01 and np.abs(rate - 0.1).max() < 0.11  # (≈ 5 sd)
    again = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, poisson=True)
    again.load_state_dict(dp.state_dict())  # a resume draws what the crashed run would
    assert [again.sample(r) for r in range(200)] == draws
    # where the seed comes from: the OS, through secrets (as the noise's); seed= fixes it
    monkeypatch.setattr("secrets.randbits", lambda bits: 777)
    drawn = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, poisson=True)
    assert drawn.sample(3) == fl.sample(100, rate=0.1, round=3, seed=777)
    a, b = (fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, poisson=True, seed=5)
            for _ in range(2))  # fmt: skip
    assert [a.sample(r) for r in range(5)] == [b.sample(r) for r in range(5)]
    with pytest.raises(ValueError, match=r"varies around per_round=10: .* poisson=True"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10).sample(0)


def test_a_loop_drawing_with_dp_sample_is_charged_at_its_rate_and_does_not_warn():
    from opacus.accountants import RDPAccountant

    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=50, per_round=5, poisson=True, seed=0)
    x, sizes = {"w": torch.zeros(4)}, []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for r in range(40):
            chosen = dp.sample(r)
            sizes.append(len(chosen))
            x = dp.step(x, [{"w": x["w"] + 0.1} for _ in chosen])
    assert max(sizes) > 5 and dp.rounds == 40
    ref = RDPAccountant()
    ref.history = [(1.0, 0.1, 40)]
    assert dp.epsilon(1e-5) == ref.get_epsilon(1e-5)


def test_epsilon_without_poisson_warns_once_that_it_is_not_a_bound_for_other_draws():
    # the default (poisson=False) loop draws a fixed count or by weight, for which the
    # Poisson epsilon is under-reported (docs/federated.md); it was reported silently
    x = {"w": torch.zeros(3)}
    fixed = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, seed=0)
    assert fixed.epsilon(1e-5) == 0.0  # nothing spent yet: nothing to warn about
    fixed.step(x, [x] * 10)
    with pytest.warns(UserWarning, match=r"Poisson sampling at rate 0\.1\b") as said:
        first = fixed.epsilon(1e-5)
    message = str(said[0].message)
    assert "dp.sample(round)" in message and "poisson=True" in message  # the fix
    assert "fl.sample(count=)" in message  # and what it is not a bound for
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fixed.epsilon(1e-5) == first  # once per DPFedAvg
        poisson = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, seed=0,
                              poisson=True)  # fmt: skip
        everyone = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=10, seed=0)
        noiseless = fl.DPFedAvg(clip=1.0, noise=0.0, clients=100, per_round=10, seed=0)
        for dp in (poisson, everyone, noiseless):
            dp.step(x, [x] * 10)
        assert poisson.epsilon(1e-5) == first  # the same accountant, said without a warning
        assert 0 < everyone.epsilon(1e-5) < math.inf  # q = 1: no sampling to misread
        assert noiseless.epsilon(1e-5) == math.inf
