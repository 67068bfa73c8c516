"""Federated rounds over a frozen backbone: what the server does to keys no client trains."""

import warnings

import pytest
import torch

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
