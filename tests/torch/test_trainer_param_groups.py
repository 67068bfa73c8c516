"""docs/trainer.md's recipes for what has no option: parameter groups (a factory closing
over module(g).named_parameters()) and clipping in an optimizer step pre-hook (by value
here; the docs' clips by value and then by norm, which no Options setting does), each
bitwise equal to the plain loop a porter had."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

torch.set_num_threads(1)


class Block(Node):
    def __init__(self) -> None:
        self.lin, self.norm, self.out = nn.Linear(5, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.out(torch.relu(self.norm(self.lin(x))))))


def batches():
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(6, 5, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(5)
    ]


def graph():
    torch.manual_seed(0)
    return Graph.somatize(Block().with_id("block"))


def groups(named):
    decay = [p for n, p in named if p.ndim > 1]
    no_decay = [p for n, p in named if p.ndim <= 1]
    return [{"params": decay, "weight_decay": 0.5}, {"params": no_decay, "weight_decay": 0.0}]


def plain(net: nn.Module, make_opt, accumulate: int = 1) -> tuple[list[float], dict]:
    """The porter's loop: batches in order, the mean over each window's examples."""
    opt = make_opt(net)
    data, losses = batches(), []
    for start in range(0, len(data), accumulate):
        window = data[start : start + accumulate]
        n = sum(len(y) for _, y in window)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for x, y in window:
            loss = F.cross_entropy(net(x), y)
            (loss * (len(y) / n)).backward()
            total += loss.detach().float() * (len(y) / n)
        opt.step()
        losses.append(float(total))
    return losses, net.state_dict()


def trained(g: Graph, factory, accumulate: int = 1) -> st.TrainResult:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=factory,
        options=st.Options(progress=False, shuffle=False, accumulate=accumulate),
    ).fit(g, batches())


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_parameter_groups_by_a_factory_over_named_parameters_train_as_a_plain_loop():
    g = graph()
    ref = copy.deepcopy(st.module(g))
    named = [(n, p) for n, p in st.module(g).named_parameters() if p.requires_grad]

    def grouped(params):
        assert {id(p) for p in params} == {id(p) for _, p in named}  # the same tensors
        return torch.optim.AdamW(groups(named), lr=0.05)

    result = trained(g, grouped)
    losses, state = plain(
        ref, lambda net: torch.optim.AdamW(groups(list(net.named_parameters())), lr=0.05)
    )
    assert result.losses == losses
    assert same(st.module(g).state_dict(), state)
    # and the groups did differ: decay on every weight, none on biases and norms
    no_groups = graph()
    trained(no_groups, lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.5))
    assert not same(st.module(no_groups).state_dict(), state)


def test_clipping_by_value_in_a_step_pre_hook_clips_the_accumulated_gradient():
    g = graph()
    ref = copy.deepcopy(st.module(g))

    def clipped(params):
        opt = torch.optim.SGD(params, lr=0.5)
        opt.register_step_pre_hook(lambda *_: nn.utils.clip_grad_value_(params, 0.01))
        return opt

    def plain_opt(net):
        params = list(net.parameters())
        opt = torch.optim.SGD(params, lr=0.5)
        opt.register_step_pre_hook(lambda *_: nn.utils.clip_grad_value_(params, 0.01))
        return opt

    result = trained(g, clipped, accumulate=2)
    losses, state = plain(ref, plain_opt, accumulate=2)
    assert result.losses == losses
    assert same(st.module(g).state_dict(), state)
    unclipped = graph()
    trained(unclipped, lambda ps: torch.optim.SGD(ps, lr=0.5), accumulate=2)
    assert not same(st.module(unclipped).state_dict(), state)  # the clip did bite
