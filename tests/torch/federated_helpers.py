"""What the federated tests share (tests/torch/test_federated*.py): a client's state dict,
a TrainResult around one, a float64 weighted-mean reference, and a Linear node."""

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Node, Opaque


def client(seed, scale=1.0, dtype=torch.float32, count=10):
    g = torch.Generator().manual_seed(seed)
    return {
        "enc.lin.weight": (torch.randn(6, 4, generator=g) * scale).to(dtype),
        "enc.lin.bias": (torch.randn(6, generator=g) * scale).to(dtype),
        "head.bn.running_mean": torch.randn(3, generator=g).to(dtype),
        "head.bn.num_batches_tracked": torch.tensor(count, dtype=torch.int64),
    }


def result(state, n):
    return st.TrainResult(state=state, num_examples=n, steps=1, epochs=1)


def reference(states, weights):
    """A straightforward float64 weighted mean, key by key."""
    total = sum(weights)
    return {
        k: sum(s[k].double() * w for s, w in zip(states, weights)) / total
        for k in states[0]
        if states[0][k].is_floating_point()
    }


class Linear(Node):
    def __init__(self, i, o):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))
