"""float8 states (``float8_e4m3fn`` and the others): every aggregator, ``fl.clip``, DP-FedAvg
and the server optimizers take them, checking and rounding on exact float32/float64
copies — torch implements neither ``isfinite`` (most of them), ``equal`` nor ``nextafter``
for them, and every rule but fedavg ended in torch's NotImplementedError."""

import math

import pytest
import torch

import somatize.torch as st
from somatize.errors import AggregationError
from somatize.torch import federated as fl

FLOAT8 = [
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
]


def states(dtype, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"w": (1.0 + 0.5 * torch.randn(6, generator=g)).to(dtype)} for _ in range(n)]


def wide(s):
    return {k: t.to(torch.float64) for k, t in s.items()}


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_every_rule_takes_float8_states_and_agrees_with_its_float64_result(dtype):
    s = states(dtype)
    rules = {
        "fedavg": lambda r: st.fedavg(r, weights="uniform"),
        "fedmedian": fl.fedmedian,
        "trimmed_mean": lambda r: fl.trimmed_mean(r, 0.2),
        "krum": lambda r: fl.krum(r, attackers=1),
        "multi_krum": lambda r: fl.multi_krum(r, attackers=1, keep=3),
        "bulyan": lambda r: fl.bulyan(r, attackers=1),
    }
    for name, rule in rules.items():
        out = rule(s)
        assert out["w"].dtype == dtype, name
        # the same rule on the float64 copies, rounded once to the float8 type
        expected = rule([wide(x) for x in s])["w"].to(dtype)
        assert torch.equal(out["w"].to(torch.float64), expected.to(torch.float64)), name


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_a_nan_in_a_float8_state_is_named_not_a_torch_error(dtype):
    s = states(dtype, n=4)
    s[3]["w"] = torch.tensor([1.0, math.nan, 1.0, 1.0, 1.0, 1.0]).to(dtype)
    for rule in (lambda r: st.fedavg(r, weights="uniform"), fl.fedmedian):
        with pytest.raises(AggregationError, match="client 3, key 'w': the update holds NaN"):
            rule(s)
    pytest.importorskip("opacus")
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=4, seed=0)
    with pytest.raises(AggregationError, match="client 3, key 'w': the update holds NaN"):
        dp.step(states(dtype, n=1)[0], s)


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_clip_rounds_float8_toward_the_global_value_within_the_norm(dtype):
    glob = {"w": torch.ones(6).to(dtype)}
    s = states(dtype, n=5, seed=1)
    grid = sorted({float(v) for v in torch.arange(256, dtype=torch.uint8).view(dtype).double()})
    grid = [v for v in grid if math.isfinite(v)]
    for max_norm in (0.1, 0.3, 1.0):
        for before, after in zip(s, fl.clip(s, glob, max_norm)):
            x, y = glob["w"].double(), after["w"].double()
            u = before["w"].double() - x
            norm = float(u.norm())
            assert after["w"].dtype == dtype
            if norm <= max_norm:
                assert torch.equal(y, before["w"].double())
                continue
            target = x + u * (max_norm / norm)
            for xi, ti, yi in zip(x.tolist(), target.tolist(), y.tolist()):
                # the grid value nearest the target on the global value's side of it
                side = [v for v in grid if min(xi, ti) <= v <= max(xi, ti)]
                assert yi == min(side, key=lambda v: abs(v - ti)), (xi, ti, yi)
            assert float((y - x).norm()) <= max_norm


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_dp_fedavg_and_the_server_optimizers_step_float8_states(dtype):
    glob = {"w": torch.ones(6).to(dtype)}
    s = states(dtype, n=3, seed=2)
    pytest.importorskip("opacus")
    dp = fl.DPFedAvg(clip=0.5, noise=0.0, clients=10, per_round=3, seed=0)
    out = dp.step(glob, s)
    total = sum(fl.clipping.clip_update(x, glob, 0.5)[0]["w"] for x in s)
    assert torch.equal(out["w"], (glob["w"].double() + total / 3).to(dtype))
    assert dp.rounds == 1 and len(dp.norms) == 3
    aggregate = st.fedavg(s, weights="uniform")
    for server in (fl.FedAvgM(lr=1.0, momentum=0.0), fl.FedAdam(lr=0.1)):
        stepped = server.step(glob, aggregate)
        assert stepped["w"].dtype == dtype and server.steps == 1
    assert torch.equal(
        fl.FedAvgM(lr=1.0, momentum=0.0).step(glob, aggregate)["w"].double(),
        aggregate["w"].double(),
    )
