"""Federated rounds over a frozen backbone: what the server does to keys no client trains."""

import warnings

import pytest
import torch

import somatize.torch as st
from somatize.torch import federated as fl

pytest.importorskip("opacus")

GLOBAL = {"enc.w": torch.ones(8, 4), "head.w": torch.zeros(3, 8), "head.b": torch.zeros(3)}


def clients(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "enc.w": GLOBAL["enc.w"].clone(),  # frozen: every client sends it back unchanged
            "head.w": torch.randn(3, 8, generator=g),
            "head.b": torch.randn(3, generator=g),
        }
        for _ in range(n)
    ]


def test_dp_fedavg_warns_that_it_noises_keys_no_client_changed():
    dp = fl.DPFedAvg(clip=1.0, noise=0.5, clients=4, per_round=4, seed=0)
    with pytest.warns(UserWarning, match=r"\['enc.w'\] came back unchanged from every client") as w:
        out = dp.step(GLOBAL, clients())
    assert "exclude=" in str(w[0].message)
    assert not torch.equal(out["enc.w"], GLOBAL["enc.w"])  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp.step(GLOBAL, clients(seed=1))  # once per DPFedAvg


def test_dp_fedavg_with_the_frozen_keys_excluded_keeps_them_and_does_not_warn():
    dp = fl.DPFedAvg(clip=1.0, noise=0.5, clients=4, per_round=4, seed=0, exclude=["enc.*"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = dp.step(GLOBAL, clients())
    assert torch.equal(out["enc.w"], GLOBAL["enc.w"])
    assert not torch.equal(out["head.w"], GLOBAL["head.w"])


def test_dp_fedavg_does_not_warn_when_every_key_moved_or_no_client_came():
    dp = fl.DPFedAvg(clip=1.0, noise=0.5, clients=4, per_round=4, seed=0)
    moved = [{k: v + 0.1 for k, v in s.items()} for s in clients()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp.step(GLOBAL, moved)
        dp.step(GLOBAL, [])


def test_dp_fedavg_does_not_warn_when_no_key_moved_at_all():
    dp = fl.DPFedAvg(clip=1.0, noise=0.5, clients=4, per_round=4, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp.step(GLOBAL, [dict(GLOBAL) for _ in range(4)])  # a degenerate round, not a frozen part


def _frozen_round(n=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    frozen = {"enc.w": torch.randn(16, 8, generator=g), "enc.h": torch.randn(8, generator=g).half()}
    start = {**frozen, "head.w": torch.zeros(3, 8)}
    states = [{**{k: v.clone() for k, v in frozen.items()}, "head.w": torch.randn(3, 8, generator=g)}
              for _ in range(n)]  # fmt: skip
    return start, states


RULES = {
    "fedavg": lambda g, s: st.fedavg(s, weights=[7, 13, 101, 1, 3, 5, 2, 9, 4, 6, 8]),
    "fedmedian": lambda g, s: fl.fedmedian(s),
    "trimmed_mean": lambda g, s: fl.trimmed_mean(s, 0.2),
    "multi_krum": lambda g, s: fl.multi_krum(s, attackers=2, keep=4),
    "bulyan": lambda g, s: fl.bulyan(s, attackers=2),
    "clip": lambda g, s: st.fedavg(fl.clip(s, g, 0.5), weights="uniform"),
    "fedadam": lambda g, s: fl.FedAdam(lr=0.1).step(g, st.fedavg(s, weights="uniform")),
    "fedyogi": lambda g, s: fl.FedYogi(lr=0.1).step(g, st.fedavg(s, weights="uniform")),
    "fedavgm": lambda g, s: fl.FedAvgM(lr=1.0).step(g, st.fedavg(s, weights="uniform")),
}


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_gives_back_a_frozen_key_bit_for_bit(rule):
    """The next round's cache keys hold the backbone's weights: any rounding of a key that
    no client moved would make every row of every later round miss."""
    start, states = _frozen_round()
    out = RULES[rule](start, states)
    assert torch.equal(out["enc.w"], start["enc.w"]) and torch.equal(out["enc.h"], start["enc.h"])
    assert not torch.equal(out["head.w"], start["head.w"])
