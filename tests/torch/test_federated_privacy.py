"""DP-FedAvg: clipped updates, noise of scale σ·C, ε from Opacus's accountant growing with
rounds, resumes, argument checks, the noise's seed and low-precision contributions."""

import math
import sys
import warnings

import pytest
import torch

from somatize.errors import AggregationError, MissingExtraError
from somatize.torch import federated as fl
from tests.torch.privacy_rounds import GLOBAL, round_of

pytest.importorskip("opacus")


def test_clipping_bounds_every_update_without_noise():
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=100, per_round=10)
    results = round_of(GLOBAL, scale=5.0)
    out = dp.step(GLOBAL, results)
    assert min(dp.norms) > 100  # every update was far larger than C ...
    for s in results:  # ... and each one, clipped, has norm C
        clipped, norm = fl.clipping.clip_state(s, GLOBAL, 1.0)
        d = torch.cat([(clipped[k] - GLOBAL[k]).reshape(-1).double() for k in ("w", "b")])
        assert norm > 100 and float(d.norm()) == pytest.approx(1.0, rel=1e-5)
    mean = torch.cat([(out[k] - GLOBAL[k]).reshape(-1).double() for k in ("w", "b")])
    assert float(mean.norm()) <= 1.0 + 1e-6  # the mean of updates of norm ≤ C
    assert out["count"].item() == 4 and dp.epsilon(1e-5) == float("inf")


def test_noise_has_scale_sigma_times_clip_on_the_sum():
    sigma, clip, m = 1.5, 0.2, 10
    dp = fl.DPFedAvg(clip=clip, noise=sigma, clients=100, per_round=m, seed=0)
    out = dp.step(GLOBAL, [dict(GLOBAL) for _ in range(m)])  # zero updates: only noise
    noise = torch.cat([(out[k] - GLOBAL[k]).reshape(-1).double() for k in ("w", "b")]) * m
    assert noise.numel() == 5050
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.05)  # ± 5 standard errors
    assert abs(float(noise.mean())) < 5 * sigma * clip / noise.numel() ** 0.5


def test_epsilon_grows_with_rounds_and_resume_is_exact():
    dp = fl.DPFedAvg(clip=1.0, noise=1.1, clients=100, per_round=10, seed=3, poisson=True)
    x, eps = GLOBAL, []
    for r in range(3):
        x = dp.step(x, round_of(x, 0.01, seed=r))
        eps.append(dp.epsilon(delta=1e-5))
    assert 0 < eps[0] < eps[1] < eps[2]
    again = fl.DPFedAvg(clip=1.0, noise=1.1, clients=100, per_round=10, poisson=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same settings: a resume says nothing
        again.load_state_dict(dp.state_dict())
    assert again.epsilon(1e-5) == eps[-1]
    nxt = round_of(x, 0.01, seed=9)
    a, b = dp.step(x, nxt), again.step(x, nxt)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_with_other_settings_warns_naming_both_and_epsilon_composes_both():
    from opacus.accountants import RDPAccountant

    dp = fl.DPFedAvg(clip=1.0, noise=1.1, clients=100, per_round=10, seed=3, poisson=True)
    x = GLOBAL
    for r in range(3):
        x = dp.step(x, round_of(x, 0.01, seed=r))
    other = fl.DPFedAvg(clip=0.5, noise=0.8, clients=100, per_round=20, seed=3, poisson=True)
    with pytest.warns(UserWarning, match=r"noise=1\.1 \(this DPFedAvg: 0\.8\)") as w:
        other.load_state_dict(dp.state_dict())
    message = str(w[0].message)
    assert "clip=1.0 (this DPFedAvg: 0.5)" in message and "sample_rate=0.1" in message
    assert "fl.DPFedAvg(clip=1.0, noise=1.1, clients=100, per_round=10" in message  # the fix
    for r in range(2):
        x = other.step(x, round_of(x, 0.01, clients=20, seed=10 + r))
    # ε is the composition of both settings' rounds, as Opacus's accountant composes them
    plain = RDPAccountant()
    for noise, rate in [(1.1, 0.1)] * 3 + [(0.8, 0.2)] * 2:
        plain.step(noise_multiplier=noise, sample_rate=rate)
    assert other.epsilon(1e-5) == pytest.approx(plain.get_epsilon(delta=1e-5), rel=1e-12)


def test_noiseless_rounds_before_a_resume_with_noise_leave_epsilon_infinite():
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=100, per_round=10)
    x = dp.step(GLOBAL, round_of(GLOBAL, 0.01))  # ε = ∞ from here on, whatever follows
    noisy = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10)
    with pytest.warns(UserWarning, match=r"noise=0\.0 \(this DPFedAvg: 1\.0\)"):
        noisy.load_state_dict(dp.state_dict())
    noisy.step(x, round_of(x, 0.01, seed=1))
    assert noisy.epsilon(1e-5) == math.inf


def test_arguments_are_checked():
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2)
    with pytest.raises(AggregationError, match="key 'b'.*float64.*global state's torch.float32"):
        dp.step(GLOBAL, [{**GLOBAL, "b": GLOBAL["b"].double()}] * 2)
    with pytest.raises(ValueError, match="per_round ≤ clients"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=5, per_round=10)
    with pytest.raises(ValueError, match="clip must be a positive"):
        fl.DPFedAvg(clip=0, noise=1.0, clients=5, per_round=1)
    with pytest.raises(ValueError, match="delta"):
        fl.DPFedAvg(clip=1, noise=1.0, clients=5, per_round=1).epsilon(0)


def test_a_nan_update_says_to_drop_the_client_not_an_option_dpfedavg_lacks():
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, seed=0)
    results = round_of(GLOBAL, scale=0.1, clients=2)
    results[1]["b"][3] = float("nan")
    with pytest.raises(AggregationError) as e:
        dp.step(GLOBAL, results)
    message = str(e.value)
    assert message.startswith("client 1, key 'b': the update holds NaN or inf; ")
    assert "DPFedAvg takes no nonfinite=: drop that client's result" in message
    assert "pass nonfinite='skip'" not in message and dp.rounds == 0


def test_without_opacus_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    with pytest.raises(MissingExtraError, match=r"somatize\[dp\]"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=1)


def test_the_default_noise_is_seeded_from_the_os_and_cannot_be_regenerated(monkeypatch):
    # with seed=0 by default, anyone who knew the library stripped the noise off the
    # published model and recovered a client's update (audit: 3e-16 away)
    glob = {"w": torch.zeros(20, dtype=torch.float64)}
    secret = {
        "w": 0.05 * torch.randn(20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    }
    published = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10).step(glob, [secret])
    for guess in (0, 1, 42):  # the attacker regenerates the noise of a guessed seed
        noise = torch.randn(20, dtype=torch.float64, generator=torch.Generator().manual_seed(guess))
        recovered = published["w"] * 10 - noise
        assert float((recovered - secret["w"]).abs().max()) > 0.1
    a, b = (fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10) for _ in range(2))
    assert not torch.equal(a.step(glob, [glob])["w"], b.step(glob, [glob])["w"])
    # where the seed comes from: 64 bits of the OS's randomness, through secrets
    monkeypatch.setattr("secrets.randbits", lambda bits: 12345 + bits)
    drawn = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10).step(glob, [glob])
    fixed = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, seed=12345 + 64)
    assert torch.equal(drawn["w"], fixed.step(glob, [glob])["w"])


def test_an_explicit_seed_reproduces_the_noise_and_a_default_seeded_run_resumes_bitwise():
    a, b = (fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, seed=7) for _ in range(2))
    assert torch.equal(a.step(GLOBAL, [GLOBAL])["w"], b.step(GLOBAL, [GLOBAL])["w"])
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10)  # seeded by the OS
    x = dp.step(GLOBAL, round_of(GLOBAL, 0.01, seed=1))
    again = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10)  # another seed ...
    again.load_state_dict(dp.state_dict())  # ... replaced by the generator's state
    nxt = round_of(x, 0.01, seed=2)
    assert all(
        torch.equal(u, v) for u, v in zip(dp.step(x, nxt).values(), again.step(x, nxt).values())
    )
    for bad in (True, 1.5, "0", 2**64):
        with pytest.raises(ValueError, match=r"seed must be None \(drawn from the OS"):
            fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, seed=bad)


def low_precision_rounds():
    """(global state, clients, C) in fp16 and bf16: updates of 0.01 per weight clipped to
    0.1, and bf16 weights that moved one ulp each clipped to 0.5 (a scale of 0.64)."""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        glob = {"w": (torch.rand(10000, generator=g) + 0.5).to(dtype)}
        noise = [0.01 * torch.randn(10000, generator=g) for _ in range(4)]
        yield glob, [{"w": (glob["w"].float() + n).to(dtype)} for n in noise], 0.1
    glob = {"w": torch.ones(10000, dtype=torch.bfloat16)}
    yield glob, [{"w": (glob["w"].float() + 2.0**-7).to(torch.bfloat16)}] * 4, 0.5


def test_low_precision_contributions_are_within_the_clip_norm(monkeypatch):
    # each client's clipped state was rounded to the model's dtype and the update read back
    # from it: an fp16 contribution of 0.1047 for C = 0.1, a bf16 one of 1.56 × C
    from somatize.torch.federated import privacy

    contributions = []

    def spy(*args, **kwargs):
        update, norm = real(*args, **kwargs)
        contributions.append(math.sqrt(sum(float(d.pow(2).sum()) for d in update.values())))
        return update, norm

    real = privacy.clip_update
    monkeypatch.setattr(privacy, "clip_update", spy)
    for glob, states, clip in low_precision_rounds():
        contributions.clear()
        dp = fl.DPFedAvg(clip=clip, noise=0.0, clients=100, per_round=10)
        out = dp.step(glob, states)
        assert len(contributions) == 4 and max(contributions) <= clip < min(dp.norms)
        # by hand: float64 updates scaled to C, summed, / per_round, rounded once
        total = sum(
            (s["w"].double() - glob["w"].double()) * (clip / norm)
            for s, norm in zip(states, dp.norms)
        )
        want = (glob["w"].double() + total / 10).to(glob["w"].dtype)
        assert out["w"].dtype == glob["w"].dtype and torch.equal(out["w"], want)


def test_counts_take_numpy_integers_as_fl_sample_does_and_bools_are_refused():
    import numpy as np

    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=np.int64(100), per_round=np.int32(10))
    assert (dp.clients, dp.per_round, dp.sample_rate) == (100, 10, 0.1)
    assert type(dp.clients) is int
    with pytest.raises(ValueError, match=r"clip must be a positive finite norm, not True"):
        fl.DPFedAvg(clip=True, noise=1.0, clients=10, per_round=2)
    with pytest.raises(ValueError, match=r"noise must be a non-negative multiplier, not True"):
        fl.DPFedAvg(clip=1.0, noise=True, clients=10, per_round=2)
    with pytest.raises(ValueError, match=r"clip must be a positive finite norm, not '1'; e\.g\."):
        fl.DPFedAvg(clip="1", noise=1.0, clients=10, per_round=2)  # not Python's bare '>'
    with pytest.raises(ValueError, match=r"per_round must be a positive int .*, not 2.0"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2.0)


def test_a_delta_of_one_over_clients_or_more_warns():
    # delta=0.5 with 10 clients was taken silently (epsilon 0.19): such a delta allows
    # publishing one client's data whole
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=10, seed=0)
    dp.step(GLOBAL, round_of(GLOBAL, 0.01))
    for delta in (0.5, 0.1):
        with pytest.warns(UserWarning, match=r"delta=0\.\d: a delta of 1/clients \(0\.1\)"):
            dp.epsilon(delta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert 0 < dp.epsilon(0.099) < dp.epsilon(1e-5)  # below 1/clients: silent


def test_each_client_counts_once_whatever_its_number_of_examples():
    # weighting by num_examples (fedavg's default) would let a client's weight exceed
    # 1/per_round, past the sensitivity the noise covers, and publish the counts
    from tests.torch.federated_helpers import result

    states = round_of(GLOBAL, 0.5, clients=3, seed=4)
    plain = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=3, seed=2)
    counted = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=3, seed=2)
    a = plain.step(GLOBAL, states)
    b = counted.step(GLOBAL, [result(s, n) for s, n in zip(states, (0, 1, 50000))])
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_epsilon_takes_rdp_orders_past_opacus_default_where_a_large_sigma_needs_them():
    # sigma=20: Opacus's default orders (up to 63) gave 0.107 and warned to widen them,
    # which dp.epsilon gave no way to do; the bound at order 200 is 0.035
    from opacus.accountants import RDPAccountant

    dp = fl.DPFedAvg(clip=1.0, noise=20.0, clients=1000, per_round=10, seed=0, poisson=True)
    dp.accountant.history, dp.rounds = [(20.0, 0.01, 500)], 500  # 500 rounds, charged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eps = dp.epsilon(1e-5)
    ref = RDPAccountant()
    ref.history = [(20.0, 0.01, 500)]
    orders = [float(a) for a in range(100, 401, 4)]
    assert eps == pytest.approx(ref.get_privacy_spent(delta=1e-5, alphas=orders)[0], rel=0.01)
    assert eps < 0.04
    ref.history = [(1.1, 0.1, 30)]  # where the best order is below 63: Opacus's own ε
    dp.accountant.history, dp.noise, dp.rounds = [(1.1, 0.1, 30)], 1.1, 30
    assert dp.epsilon(1e-5) == ref.get_epsilon(1e-5)


def test_noise_for_finds_the_sigma_of_a_target_epsilon_and_names_one_out_of_reach():
    # Opacus's get_noise_multiplier, called as it is, warned at its own probes ("consider
    # expanding the range of alphas") and searched on other orders than dp.epsilon's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sigma = fl.DPFedAvg.noise_for(8.0, delta=1e-5, rounds=500, clients=1000, per_round=10)
    dp = fl.DPFedAvg(clip=1.0, noise=sigma, clients=1000, per_round=10, poisson=True, seed=0)
    dp.accountant.history, dp.rounds = [(sigma, 0.01, 500)], 500  # 500 rounds, charged
    assert 7.98 < dp.epsilon(1e-5) <= 8.0
    with pytest.raises(ValueError, match=r"no noise multiplier up to 1e6 reaches epsilon=1e-07 "):
        fl.DPFedAvg.noise_for(1e-7, delta=1e-5, rounds=500, clients=1000, per_round=10)
    for bad in (0, -1.0, math.inf, True):
        with pytest.raises(ValueError, match="epsilon must be a positive finite target"):
            fl.DPFedAvg.noise_for(bad, delta=1e-5, rounds=5, clients=10, per_round=2)
    with pytest.raises(ValueError, match=r"per_round ≤ clients"):
        fl.DPFedAvg.noise_for(1.0, delta=1e-5, rounds=5, clients=10, per_round=20)
    with pytest.warns(UserWarning, match=r"delta=0\.2: a delta of 1/clients"):
        fl.DPFedAvg.noise_for(1.0, delta=0.2, rounds=5, clients=10, per_round=2)


def test_clients_missing_a_key_of_the_global_state_are_named_with_the_fix():
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=100, per_round=10)
    results = round_of(GLOBAL, 1.0)
    for r in results:
        del r["b"]
    with pytest.raises(AggregationError, match=r"differ in \['b'\]; clients must return the state"):
        dp.step(GLOBAL, results)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_server_on_a_gpu_steps_as_one_on_the_cpu():
    # the sum was made on the CPU: CUDA states failed with a device mismatch
    gen = torch.Generator().manual_seed(0)
    glob = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    states = [
        {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in glob.items()}
        for _ in range(3)
    ]

    def cuda(s):
        return {k: v.cuda() for k, v in s.items()}

    on_cpu = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=3, seed=0).step(glob, states)
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=3, seed=0)
    on_gpu = dp.step(cuda(glob), [cuda(s) for s in states])
    for k, v in on_cpu.items():
        assert on_gpu[k].is_cuda
        torch.testing.assert_close(on_gpu[k].cpu(), v)
