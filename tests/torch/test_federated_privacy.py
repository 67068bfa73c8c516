"""DP-FedAvg: clipped updates, noise of scale σ·C, ε from Opacus's accountant growing with rounds."""

import math
import sys
import warnings

import numpy as np
import pytest
import torch

from somatize.errors import AggregationError, MissingExtraError
from somatize.torch import federated as fl

pytest.importorskip("opacus")


def round_of(global_state, scale, clients=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in global_state.items()
        }
        for _ in range(clients)
    ]


GLOBAL = {"w": torch.zeros(100, 50), "b": torch.zeros(50), "count": torch.tensor(4)}


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
    dp = fl.DPFedAvg(clip=1.0, noise=1.1, clients=100, per_round=10, seed=3)
    x, eps = GLOBAL, []
    for r in range(3):
        x = dp.step(x, round_of(x, 0.01, seed=r))
        eps.append(dp.epsilon(delta=1e-5))
    assert 0 < eps[0] < eps[1] < eps[2]
    again = fl.DPFedAvg(clip=1.0, noise=1.1, clients=100, per_round=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same settings: a resume says nothing
        again.load_state_dict(dp.state_dict())
    assert again.epsilon(1e-5) == eps[-1]
    nxt = round_of(x, 0.01, seed=9)
    a, b = dp.step(x, nxt), again.step(x, nxt)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_with_other_settings_warns_naming_both_and_epsilon_composes_both():
    from opacus.accountants import RDPAccountant

    dp = fl.DPFedAvg(clip=1.0, noise=1.1, clients=100, per_round=10, seed=3)
    x = GLOBAL
    for r in range(3):
        x = dp.step(x, round_of(x, 0.01, seed=r))
    other = fl.DPFedAvg(clip=0.5, noise=0.8, clients=100, per_round=20, seed=3)
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


def test_without_opacus_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    with pytest.raises(MissingExtraError, match=r"somatize\[dp\]"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=1)


def bn_round(clients=4, seed=0):
    """A Linear + BatchNorm model's global state, and clients that moved every float key
    (the statistics far more than the weights, as a client's data moves them)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    glob = {k: v.clone() for k, v in net.state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    states = []
    for i in range(clients):
        s = {}
        for k, v in glob.items():
            if not v.is_floating_point():
                s[k] = v + 3 + i  # num_batches_tracked
            else:
                scale = 5.0 if k.startswith("1.running") else 0.5
                s[k] = v + scale * torch.randn(v.shape, generator=g)
        states.append(s)
    buffers = [k for k, _ in net.named_buffers()]
    return glob, states, buffers


WEIGHTS = ("0.weight", "0.bias", "1.weight", "1.bias")
STATS = ("1.running_mean", "1.running_var")


def reference(glob, states, keys, clip, per_round):
    """DP-FedAvg without noise, by hand: each update over ``keys`` clipped to ``clip``,
    summed, divided by per_round; and each client's norm."""
    out, norms = {k: glob[k].double().clone() for k in keys}, []
    for s in states:
        d = {k: s[k].double() - glob[k].double() for k in keys}
        norm = float(torch.cat([v.reshape(-1) for v in d.values()]).norm())
        norms.append(norm)
        for k in keys:
            out[k] += d[k] * min(1.0, clip / norm) / per_round
    return {k: v.to(glob[k].dtype) for k, v in out.items()}, norms


def test_float_buffers_are_refused_without_a_policy_naming_the_keys_and_the_choices():
    glob, states, buffers = bn_round()
    for dp in (
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=4),  # found by their names
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=4, buffers=buffers),
    ):
        with pytest.raises(AggregationError) as e:
            dp.step(glob, states)
        msg = str(e.value)
        assert "'1.running_mean', '1.running_var'" in msg
        for choice in ("buffer_policy='global'", "'noised'", "'unprotected_mean'", "GroupNorm"):
            assert choice in msg
        assert dp.rounds == 0 and dp.accountant.history == []  # nothing was spent
    # a float buffer of another name counts once buffers= names it
    plain = {"w": torch.zeros(3), "scale": torch.ones(2)}
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=2, buffers=["scale"])
    with pytest.raises(AggregationError, match=r"\['scale'\] are float buffers"):
        dp.step(plain, [plain, plain])
    # a model without float buffers steps as before, and integer buffers are no reason to refuse
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=2, buffers=["count"])
    out = dp.step(GLOBAL, [GLOBAL, GLOBAL])
    assert torch.equal(out["w"], GLOBAL["w"]) and out["count"].item() == 4


def test_global_policy_keeps_the_servers_buffers_out_of_the_norm_and_the_noise():
    glob, states, buffers = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=0.0, clients=10, per_round=4, buffers=buffers,
                     buffer_policy="global")  # fmt: skip
    out = dp.step(glob, states)
    want, norms = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    for k in WEIGHTS:
        torch.testing.assert_close(out[k], want[k], atol=1e-7, rtol=0)
    assert dp.norms == pytest.approx(norms, rel=1e-12)  # the weights' update only
    for k in (*STATS, "1.num_batches_tracked"):  # named integer buffers too
        assert torch.equal(out[k], glob[k])
    noisy = fl.DPFedAvg(clip=0.5, noise=2.0, clients=10, per_round=4, buffers=buffers,
                        buffer_policy="global", seed=1)  # fmt: skip
    out = noisy.step(glob, states)
    assert all(torch.equal(out[k], glob[k]) for k in STATS)  # no noise on them either
    assert not torch.allclose(out["0.weight"], want["0.weight"], atol=1e-3)  # but on weights


def test_global_policy_keeps_integer_buffers_buffers_did_not_name():
    # the statistics are found by name; their counter must stay the server's too, or the
    # round would publish the largest client's number of batches, which epsilon does not cover
    glob, states, _ = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=0.0, clients=10, per_round=4, buffer_policy="global")
    out = dp.step(glob, states)
    for k in (*STATS, "1.num_batches_tracked"):
        assert torch.equal(out[k], glob[k])
    want, _ = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    for k in WEIGHTS:
        torch.testing.assert_close(out[k], want[k], atol=1e-7, rtol=0)


def test_unprotected_mean_policy_averages_the_buffers_in_the_clear():
    glob, states, buffers = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=3.0, clients=10, per_round=4, buffers=buffers,
                     buffer_policy="unprotected_mean")  # fmt: skip
    out = dp.step(glob, states)
    for k in STATS:  # the plain mean, no noise: what epsilon does not cover
        mean = torch.stack([s[k].double() for s in states]).mean(0).float()
        torch.testing.assert_close(out[k], mean, atol=1e-7, rtol=0)
    _, norms = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    assert dp.norms == pytest.approx(norms, rel=1e-12)
    assert out["1.num_batches_tracked"].item() == glob["1.num_batches_tracked"].item() + 6  # max


def test_noised_policy_treats_the_statistics_as_weights():
    glob, states, _ = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=0.0, clients=10, per_round=4, buffer_policy="noised")
    out = dp.step(glob, states)  # found by their names, clipped and noised with the rest
    want, norms = reference(glob, states, WEIGHTS + STATS, clip=0.5, per_round=4)
    assert dp.norms == pytest.approx(norms, rel=1e-12)
    for k in WEIGHTS + STATS:
        torch.testing.assert_close(out[k], want[k], atol=1e-7, rtol=0)
    _, weights_only = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    assert min(n - w for n, w in zip(norms, weights_only)) > 1  # the statistics dominate


def test_buffer_arguments_are_checked():
    with pytest.raises(ValueError, match=r"buffer_policy must be 'global', 'noised'.*'keep'"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, buffer_policy="keep")
    with pytest.raises(TypeError, match=r"not the string 'bn.running_mean'; pass \['bn"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, buffers="bn.running_mean")
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, buffers=["bn.running_var"],
                     buffer_policy="global")  # fmt: skip
    with pytest.raises(AggregationError, match=r"buffers names keys the state does not hold"):
        dp.step(GLOBAL, [GLOBAL, GLOBAL])


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


def test_an_empty_round_adds_the_noise_alone_and_is_charged():
    # Poisson sampling (what the accountant analyses) draws nobody now and then, and a round
    # whose every client failed is empty once they are dropped; both were refused
    glob, _, buffers = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=1.3, clients=100, per_round=4, seed=5, buffers=buffers,
                     buffer_policy="unprotected_mean")  # fmt: skip
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
    assert dp.epsilon(1e-5) >= real.get_epsilon(1e-5) > 1.2 * uniform.epsilon(1e-5)
    equal = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, weights=[2.0] * 100)
    assert equal.sample_rate == 0.1
    with pytest.raises(ValueError, match=r"DPFedAvg\(weights=\): weights must be 100 finite"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, weights=sizes[:50])
    with pytest.raises(ValueError, match="the list of sampling weights given to fl.sample"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, weights="sizes")


def test_counts_take_numpy_integers_as_fl_sample_does_and_bools_are_refused():
    import numpy as np

    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=np.int64(100), per_round=np.int32(10))
    assert (dp.clients, dp.per_round, dp.sample_rate) == (100, 10, 0.1)
    assert type(dp.clients) is int
    with pytest.raises(ValueError, match=r"clip must be a positive finite norm, not True"):
        fl.DPFedAvg(clip=True, noise=1.0, clients=10, per_round=2)
    with pytest.raises(ValueError, match=r"noise must be a non-negative multiplier, not True"):
        fl.DPFedAvg(clip=1.0, noise=True, clients=10, per_round=2)
    with pytest.raises(ValueError, match=r"per_round must be a positive int .*, not 2.0"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2.0)


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
