"""The small net, data and settings the Trainer tests share (tests/torch/test_trainer*.py
and others): a Linear >> Tanh >> Linear graph, its plain-PyTorch twin, batches."""

from __future__ import annotations

import copy

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Linear(Node):
    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Tanh(Node):
    def forward(self, x, ctx):
        return Done(Opaque(torch.tanh(x)))


def make_graph(seed: int = 0) -> Graph:
    torch.manual_seed(seed)
    return Graph.somatize(Linear(4, 8) >> Tanh() >> Linear(8, 3))


def plain_copy(g: Graph) -> nn.Module:
    """The same network written by hand, with the graph's current weights."""
    return nn.Sequential(
        copy.deepcopy(g["linear"].lin), nn.Tanh(), copy.deepcopy(g["linear_2"].lin)
    )


def plain_state(m: nn.Module) -> dict[str, torch.Tensor]:
    names = {"0": "linear.lin", "2": "linear_2.lin"}
    return {f"{names[k.split('.')[0]]}.{k.split('.', 1)[1]}": v for k, v in m.state_dict().items()}


def batches(n: int = 6, size: int = 10, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 4, generator=gen), torch.randint(0, 3, (size,), generator=gen))
        for _ in range(n)
    ]


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def quiet(**kw) -> st.Options:
    return st.Options(progress=False, **kw)


class Capture(torch.optim.SGD):
    """lr 0: records every step's gradients and leaves the weights alone."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.0)
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() for p in self.param_groups[0]["params"]])
