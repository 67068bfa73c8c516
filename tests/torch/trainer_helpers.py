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


def step_parts(data, k: int, mb: int):
    """What each optimizer step of an epoch trains on, as the Trainer splits it: groups of
    ``k`` batches (``accumulate``), each batch in ``mb`` chunks (``micro_batches``); yields
    ``(parts, n)``, the ``(x, y)`` chunks and their examples together."""
    for i in range(0, len(data), k):
        parts = [
            (xc, yc)
            for x, y in data[i : i + k]
            for xc, yc in zip(torch.chunk(x, mb), torch.chunk(y, mb), strict=True)
        ]
        yield parts, sum(len(yc) for _, yc in parts)


def porter_loop(data, k: int, mb: int, fp16: bool, before_step) -> tuple[list[float], nn.Module]:
    """A porter's plain loop over ``make_graph()``'s network for 2 epochs: groups of ``k``
    batches, each in ``mb`` chunks weighed by their share of the group's examples, fp16 with
    a ``GradScaler`` if asked; ``before_step(model)`` runs on the step's gradient (unscaled)
    just before ``opt.step()``. The losses of the steps, and the model."""
    from torch.nn import functional as F

    m = plain_copy(make_graph())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu") if fp16 else None
    losses = []
    for _ in range(2):
        for parts, n in step_parts(data, k, mb):
            opt.zero_grad(set_to_none=True)
            total = torch.zeros(())
            for xc, yc in parts:
                with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
                    loss = F.cross_entropy(m(xc), yc)
                part = loss if len(parts) == 1 else loss * (len(yc) / n)
                total += loss.detach().float() * (len(yc) / n)
                (part if scaler is None else scaler.scale(part)).backward()
            if scaler is not None:
                scaler.unscale_(opt)
            before_step(m)
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
            losses.append(float(total))
    return losses, m
