"""Small nodes the torch tests share."""

from __future__ import annotations

import torch
from torch import nn

from somatize import Done, Node, Opaque


class Layer(Node):
    """Holds one module and applies it; returns Opaque."""

    def __init__(self, layer: nn.Module):
        self.layer = layer

    def forward(self, x, ctx):
        return Done(Opaque(self.layer(x)))


class Linear(Node):
    """A linear layer; returns Opaque."""

    def __init__(self, i: int, o: int):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Concat(Node):
    """Concatenates the outputs of its inputs on the last dimension."""

    def forward(self, xs, ctx):
        return Done(Opaque(torch.cat(xs, dim=-1)))


def tensor_codec(g):
    """The TensorCodec ``module(g)`` gave the graph."""
    from somatize.torch import TensorCodec

    return next(c for c in g.codecs if isinstance(c, TensorCodec))
