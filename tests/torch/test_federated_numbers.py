"""numpy scalars (a sweep over np.arange / np.float32) are taken wherever somatize.torch.federated
takes a Python number; bools and bad values are still refused."""

import numpy as np
import pytest
import torch
from torch import nn

from somatize.torch import federated as fl


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
