"""A linear probe over a frozen backbone remembered per example, then fine-tuning the whole
model: the backbone is unfrozen and uncached, and the fine-tune equals plain PyTorch's from
the probe's weights (batch norm back in training mode, both parameter groups stepped)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import CacheError


class Backbone(Node):
    def __init__(self):
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


class Head(Node):
    def __init__(self):
        self.out = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


def batches(n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(10, 8, generator=gen), torch.randint(0, 3, (10,), generator=gen))
            for _ in range(n)]  # fmt: skip


def quiet(**kw):
    return st.Options(progress=False, shuffle=False, **kw)


def test_fine_tuning_after_a_cached_probe_equals_plain_torch():
    torch.manual_seed(0)
    g = Graph.somatize(Backbone().with_id("enc") >> Head())
    g.freeze("enc").cache("enc", per="example")
    probe = st.Trainer(loss=F.cross_entropy, epochs=3, options=quiet(),
                       optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))  # fmt: skip
    assert probe.fit(g, batches()).cache["enc"]["hits"] == 2 * 60  # the probe remembered it

    with pytest.raises(CacheError, match=r"To train it.*g\.cache\('enc', False\)"):
        g.freeze("enc", False)  # (still cached per example: refused before any step)
        st.Trainer(loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                   options=quiet()).fit(g, batches())  # fmt: skip
    g.cache("enc", False)
    probed = g["enc"].net[0].weight.detach().clone()
    model = st.module(g)  # (applies the graph's settings: the backbone's grads are back)
    plain = copy.deepcopy(nn.ModuleDict({"net": g["enc"].net, "out": g["head"].out}))
    assert all(p.requires_grad for p in plain.parameters())

    def grouped(params):  # the backbone at a tenth of the head's rate
        enc = [p for n, p in model.named_parameters() if n.startswith("enc.")]
        head = [p for n, p in model.named_parameters() if not n.startswith("enc.")]
        return torch.optim.SGD([{"params": enc, "lr": 0.01}, {"params": head, "lr": 0.1}])

    tuned = st.Trainer(loss=F.cross_entropy, epochs=2, optimizer=grouped, options=quiet())
    result = tuned.fit(g, batches())
    assert result.cache == {}

    opt = torch.optim.SGD([{"params": plain["net"].parameters(), "lr": 0.01},
                           {"params": plain["out"].parameters(), "lr": 0.1}])  # fmt: skip
    plain.train()
    for _ in range(2):
        for x, y in batches():
            opt.zero_grad()
            F.cross_entropy(plain["out"](plain["net"](x)), y).backward()
            opt.step()
    want = {
        ("enc." if k.startswith("net.") else "head.") + k: v for k, v in plain.state_dict().items()
    }
    assert set(result.state) == set(want)
    for k, v in want.items():  # weights, and the batch norm's running statistics
        assert torch.allclose(result.state[k], v, atol=1e-6), k
    assert not torch.allclose(result.state["enc.net.0.weight"], probed, atol=1e-4)  # it trained
