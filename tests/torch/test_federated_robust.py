"""Krum, multi-Krum, Bulyan and the trimmed mean: honest clients chosen, preconditions named."""

import warnings

import numpy as np
import pytest
import torch

import somatize.torch as st
from somatize.errors import AggregationError
from somatize.torch import federated as fl


def crowd(honest=8, bad=2, seed=0):
    """Honest updates near a common point, and attackers planted far away (two kinds)."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(20, generator=g)
    states = [{"w": centre + 0.1 * torch.randn(20, generator=g)} for _ in range(honest)]
    for i in range(bad):
        far = centre + (50.0 if i % 2 else -30.0) * torch.randn(20, generator=g)
        states.append({"w": far})
    return states, centre


@pytest.mark.parametrize("seed", range(3))
def test_krum_and_multi_krum_pick_honest_clients(seed):
    states, centre = crowd(seed=seed)
    perm = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [states[i] for i in perm]
    honest = {j for j, i in enumerate(perm) if i < 8}
    k = fl.krum(shuffled, attackers=2)
    assert set(k.selected) <= honest and len(k.selected) == 1
    assert torch.equal(k["w"], shuffled[k.selected[0]]["w"])
    m = fl.multi_krum(shuffled, attackers=2, keep=5)
    assert set(m.selected) <= honest and len(m.selected) == 5
    mean = torch.stack([shuffled[i]["w"].double() for i in m.selected]).mean(0)
    torch.testing.assert_close(m["w"].double(), mean, atol=1e-6, rtol=0)
    assert (m["w"] - centre).abs().max() < 0.3


def test_bulyan_stays_with_the_honest_clients():
    states, centre = crowd(honest=9, bad=2)
    out = fl.bulyan(states, attackers=2)  # n = 11 = 4f + 3
    assert set(out.selected) <= set(range(9)) and len(out.selected) == 7  # θ = n − 2f
    assert (out["w"] - centre).abs().max() < 0.3
    naive = st.fedavg(states, weights="uniform")["w"]
    assert (naive - centre).abs().max() > 3


def test_bulyan_and_krum_preconditions_name_both_numbers():
    states, _ = crowd(honest=8, bad=2)  # 10 clients
    with pytest.raises(
        AggregationError, match=r"Bulyan with attackers=2 needs at least 11 clients.*got 10"
    ):
        fl.bulyan(states, attackers=2)
    with pytest.raises(
        AggregationError, match=r"Krum with attackers=4 needs at least 11 clients.*got 10"
    ):
        fl.krum(states, attackers=4)
    with pytest.raises(ValueError, match=r"keep must be an int in \[1, 10\]"):
        fl.multi_krum(states, attackers=1, keep=11)
    with pytest.raises(ValueError, match="attackers must be a non-negative int"):
        fl.krum(states, attackers=-1)
    states[3] = {"w": torch.full((20,), float("nan"))}
    with pytest.raises(AggregationError, match="client 3, key 'w'.*NaN"):
        fl.krum(states, attackers=1)


def flower_trim_mean(array, beta):
    """Flower's ``_trim_mean`` (flwr.server.strategy.aggregate), as published."""
    n = array.shape[0]
    low = int(beta * n)
    return np.mean(np.sort(array, axis=0)[low : n - low], axis=0)


@pytest.mark.parametrize("n", [3, 4, 7, 10])
def test_trimmed_mean_accepts_every_beta_flower_accepts(n):
    values = np.random.default_rng(n).normal(size=(n, 6))
    states = [{"w": torch.tensor(v)} for v in values]
    for beta in [0.0, 0.1, 0.2, 0.25, 0.3, 1 / 3, 0.4, 0.45, 0.49, 0.4999]:
        if 0 < beta * n < 1:  # trims nothing: the plain mean, with a warning that says so
            with pytest.warns(UserWarning, match="trims int"):
                out = fl.trimmed_mean(states, beta)["w"].numpy()
        else:
            out = fl.trimmed_mean(states, beta)["w"].numpy()
        np.testing.assert_allclose(out, flower_trim_mean(values, beta), rtol=0, atol=1e-12)
    for beta in [0.5, -0.1, 1.0]:
        with pytest.raises(ValueError, match=r"beta must be in \[0, 0.5\)"):
            fl.trimmed_mean(states, beta)


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


def test_a_nan_update_under_a_distance_rule_says_to_drop_the_client_not_nonfinite_skip():
    """krum, multi_krum and bulyan take no nonfinite=: their error suggested it."""
    states, _ = crowd(honest=9, bad=2)
    states[2] = {"w": torch.full((20,), float("nan"))}
    for rule, call in (
        ("krum", lambda: fl.krum(states, attackers=1)),
        ("multi_krum", lambda: fl.multi_krum(states, attackers=1, keep=3)),
        ("bulyan", lambda: fl.bulyan(states, attackers=2)),
    ):
        with pytest.raises(AggregationError) as e:
            call()
        message = str(e.value)
        assert message.startswith("client 2, key 'w': the update holds NaN or inf; ")
        assert f"{rule} takes no nonfinite=" in message and "drop that client" in message
        assert "pass nonfinite='skip'" not in message


def test_multi_krum_checks_every_clients_weight_as_fedavg_does_and_names_its_index():
    """Only the picked clients' weights were checked, a set was taken in its own order, and
    an error named the client's place among the picked ones (client 2 was 'client 1')."""
    states = [{"w": torch.tensor([v])} for v in (50.0, 1.0, 1.1, 0.9, 1.2)]  # 0: the attacker
    assert fl.multi_krum(states, attackers=1, keep=3).selected == (1, 2, 3)
    for bad in (-5.0, float("nan")):  # on the attacker, whom Krum leaves out
        with pytest.raises(AggregationError, match=f"client 0 has weight {bad}; .*non-negative"):
            fl.multi_krum(states, attackers=1, keep=3, weights=[bad, 1, 1, 1, 1])
    with pytest.raises(AggregationError, match="client 2 has weight -1.0"):  # picked first
        fl.multi_krum(states, attackers=1, keep=3, weights=[1, 1, -1, 1, 1])
    with pytest.raises(AggregationError, match="weights is a set.*list"):
        fl.multi_krum(states, attackers=1, keep=3, weights={1, 2, 3, 4, 5})
    with pytest.raises(AggregationError, match="4 weights for 5 clients"):
        fl.multi_krum(states, attackers=1, keep=3, weights=[1, 1, 1, 1])
    with pytest.raises(AggregationError, match=r"multi_krum kept, \[1, 2, 3\], .* sum.* to 0"):
        fl.multi_krum(states, attackers=1, keep=3, weights=[1, 0, 0, 0, 1])
    out = fl.multi_krum(states, attackers=1, keep=3, weights=[0, 1, 3, 4, 0])
    assert out.weights == pytest.approx((1 / 8, 3 / 8, 4 / 8)) and out.selected == (1, 2, 3)
    assert float(out["w"]) == pytest.approx((1.0 + 3 * 1.1 + 4 * 0.9) / 8)


def test_krum_over_states_without_floats_names_their_dtypes_and_the_fix():
    ints = [{"count": torch.tensor([i], dtype=torch.int64)} for i in range(5)]
    with pytest.raises(AggregationError, match=r"hold torch\.int64; krum .*fedavg or fedmedian"):
        fl.krum(ints, attackers=1)
