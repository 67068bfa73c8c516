"""DP-FedAvg: clipped updates, noise of scale σ·C, ε from Opacus's accountant growing with rounds."""

import sys

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
        clipped, norm = fl.robust.clip_state(s, GLOBAL, 1.0)
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
    again.load_state_dict(dp.state_dict())
    assert again.epsilon(1e-5) == eps[-1]
    nxt = round_of(x, 0.01, seed=9)
    a, b = dp.step(x, nxt), again.step(x, nxt)
    assert all(torch.equal(a[k], b[k]) for k in a)


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
