"""Differential tests: networks built by hand and through ``module(g)`` agree exactly.

Same initial weights (copied by name), same inputs, same dropout seed: outputs,
gradients, batch-norm statistics and parameters after optimizer steps must be equal,
in train and in eval mode. ``state_dict`` moves between the two under a name map.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

from .tensor_nodes import Concat


class Dense(Node):
    """Linear → batch norm → ReLU → dropout."""

    def __init__(self, i: int, o: int, p: float):
        self.lin = nn.Linear(i, o)
        self.norm = nn.BatchNorm1d(o)
        self.drop = nn.Dropout(p)

    def forward(self, x, ctx):
        return Done(Opaque(self.drop(torch.relu(self.norm(self.lin(x))))))


class Head(Node):
    def __init__(self, i: int, o: int):
        self.out = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.out(x)))


class HandMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.n1, self.d1 = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.3)
        self.l2, self.n2, self.d2 = nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Dropout(0.3)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = self.d1(torch.relu(self.n1(self.l1(x))))
        x = self.d2(torch.relu(self.n2(self.l2(x))))
        return self.head(x)


def mlp_graph() -> Graph:
    return Graph.somatize(Dense(8, 16, 0.3) >> Dense(16, 16, 0.3) >> Head(16, 3))


_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
MLP_NAMES = {  # graph name -> hand name
    **{f"dense.lin.{k}": f"l1.{k}" for k in ("weight", "bias")},
    **{f"dense.norm.{k}": f"n1.{k}" for k in _BN},
    **{f"dense_2.lin.{k}": f"l2.{k}" for k in ("weight", "bias")},
    **{f"dense_2.norm.{k}": f"n2.{k}" for k in _BN},
    **{f"head.out.{k}": f"head.{k}" for k in ("weight", "bias")},
}


class ConvBlock(Node):
    def __init__(self) -> None:
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.drop = nn.Dropout2d(0.25)

    def forward(self, x, ctx):
        h = torch.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)  # (batch, 4, 4, 4)
        return Done(Opaque(self.drop(h)))


class ConvHead(Node):
    def __init__(self) -> None:
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x, ctx):
        return Done(Opaque(self.fc(x.flatten(1))))


class HandCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout2d(0.25),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64, 5))

    def forward(self, x):
        return self.classifier(self.features(x))


def cnn_graph() -> Graph:
    return Graph.somatize(ConvBlock() >> ConvHead())


CNN_NAMES = {
    **{f"conv_block.conv.{k}": f"features.0.{k}" for k in ("weight", "bias")},
    **{f"conv_block.norm.{k}": f"features.1.{k}" for k in _BN},
    "conv_head.fc.weight": "classifier.1.weight",
    "conv_head.fc.bias": "classifier.1.bias",
}

CASES = {
    "mlp": (HandMLP, mlp_graph, MLP_NAMES, (6, 8)),
    "cnn": (HandCNN, cnn_graph, CNN_NAMES, (6, 1, 8, 8)),
}


def twins(case: str):
    """The hand-written network and the graph, with the hand's initial weights copied over."""
    hand_cls, graph_fn, names, shape = CASES[case]
    torch.manual_seed(0)
    hand = hand_cls()
    torch.manual_seed(1)  # a different init, so the copy below is what makes them equal
    g = graph_fn()
    hand_state = hand.state_dict()
    st.load_state(g, {k: hand_state[v] for k, v in names.items()})
    return hand, g, names, shape


def grads(named):
    return {k: p.grad.clone() for k, p in named}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_outputs_and_gradients_match_plain_pytorch(case, mode):
    hand, g, names, shape = twins(case)
    model = st.module(g)
    hand.train(mode == "train")
    model.train(mode == "train")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    for _ in range(2):  # twice: batch-norm statistics from the first pass feed the second
        torch.manual_seed(3)
        y_hand = hand(x)
        torch.manual_seed(3)
        y_graph = model(x)
        assert_close(y_graph, y_hand)
        hand.zero_grad()
        model.zero_grad()
        (y_hand * torch.arange(y_hand.shape[1])).sum().backward()
        (y_graph * torch.arange(y_graph.shape[1])).sum().backward()
        hand_grads = grads(hand.named_parameters())
        graph_grads = grads(model.named_parameters())
        assert len(graph_grads) == len(hand_grads)
        for k, grad in graph_grads.items():
            assert_close(grad, hand_grads[names[k]], msg=k)
    hand_state = hand.state_dict()
    for k, v in model.state_dict().items():
        assert_close(v, hand_state[names[k]], msg=k)  # running statistics moved alike


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_steps_match_plain_pytorch(case):
    hand, g, names, shape = twins(case)
    model = st.module(g).train()
    hand.train()
    opt_hand = torch.optim.SGD(hand.parameters(), lr=0.1, momentum=0.9)
    opt_graph = torch.optim.SGD(st.parameters(g), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(4)
    for step in range(3):
        x = torch.randn(*shape, generator=gen)
        target = torch.randint(0, 3, (shape[0],), generator=gen)
        for net, opt in ((hand, opt_hand), (model, opt_graph)):
            torch.manual_seed(step)
            loss = nn.functional.cross_entropy(net(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    hand_state = hand.state_dict()
    for k, v in st.state(g).items():
        assert_close(v, hand_state[names[k]], msg=k)


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trips_between_hand_and_graph(case):
    hand, g, names, shape = twins(case)
    x = torch.randn(*shape)
    # graph -> a fresh hand-written network
    torch.manual_seed(5)
    other = CASES[case][0]()
    other.load_state_dict({names[k]: v for k, v in st.module(g).state_dict().items()})
    other.eval()
    st.module(g).eval()
    assert_close(other(x), st.module(g)(x))
    # hand -> a fresh graph, through module(g).load_state_dict
    torch.manual_seed(6)
    g2 = CASES[case][1]()
    hand_state = hand.state_dict()
    st.module(g2).load_state_dict({k: hand_state[v] for k, v in names.items()})
    hand.eval()
    assert_close(st.module(g2).eval()(x), hand(x))
    assert sorted(st.module(g2).state_dict()) == sorted(names)


class Stem(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(6, 8)

    def forward(self, x, ctx):
        return Done(Opaque(torch.tanh(self.lin(x))))


class Branch(Node):
    def __init__(self, width: int) -> None:
        self.lin = nn.Linear(8, width)

    def forward(self, x, ctx):
        return Done(Opaque(torch.relu(self.lin(x))))


class HandFork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 4), nn.Linear(8, 5)
        self.head = nn.Linear(9, 2)

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        return self.head(torch.cat([torch.relu(self.a(h)), torch.relu(self.b(h))], dim=-1))


FORK_NAMES = {
    **{f"stem.lin.{k}": f"stem.{k}" for k in ("weight", "bias")},
    **{f"a.lin.{k}": f"a.{k}" for k in ("weight", "bias")},
    **{f"b.lin.{k}": f"b.{k}" for k in ("weight", "bias")},
    **{f"head.out.{k}": f"head.{k}" for k in ("weight", "bias")},
}


def test_fork_graph_matches_hand_written_module():
    torch.manual_seed(0)
    hand = HandFork()
    g = Graph.somatize(
        Stem()
        >> (Branch(4).with_id("a") | Branch(5).with_id("b"))
        >> Concat()
        >> Head(9, 2).with_id("head")
    )
    hand_state = hand.state_dict()
    st.load_state(g, {k: hand_state[v] for k, v in FORK_NAMES.items()})
    x = torch.randn(7, 6)
    y_hand, y_graph = hand(x), st.module(g)(x)
    assert_close(y_graph, y_hand)
    y_hand.pow(2).sum().backward()
    y_graph.pow(2).sum().backward()
    hand_params = dict(hand.named_parameters())
    for k, p in st.module(g).named_parameters():
        assert_close(p.grad, hand_params[FORK_NAMES[k]].grad, msg=k)


class Pick(Node):
    """A root of a two-input graph: applies its layer to input ``i`` of the tuple."""

    def __init__(self, i: int, width: int) -> None:
        self.i = i
        self.lin = nn.Linear(width, 3)

    def forward(self, inputs, ctx):
        return Done(Opaque(self.lin(inputs[self.i])))


class HandTwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 3), nn.Linear(5, 3), nn.Linear(6, 1)

    def forward(self, x, y):
        return self.head(torch.cat([self.a(x), self.b(y)], dim=-1))


def test_multi_input_graph_matches_hand_written_module():
    torch.manual_seed(0)
    hand = HandTwoInputs()
    g = Graph.somatize(
        (Pick(0, 4).with_id("a") | Pick(1, 5).with_id("b"))
        >> Concat()
        >> Head(6, 1).with_id("head")
    )
    names = {
        **{f"{n}.lin.{k}": f"{n}.{k}" for n in "ab" for k in ("weight", "bias")},
        **{f"head.out.{k}": f"head.{k}" for k in ("weight", "bias")},
    }
    hand_state = hand.state_dict()
    st.load_state(g, {k: hand_state[v] for k, v in names.items()})
    x = torch.randn(3, 4, requires_grad=True)  # inputs that need grads pass as Opaque
    y = torch.randn(3, 5)
    x_graph = x.detach().clone().requires_grad_()
    out_hand, out_graph = hand(x, y), st.module(g)(x_graph, y)
    assert_close(out_graph, out_hand)
    out_hand.sum().backward()
    out_graph.sum().backward()
    assert_close(x_graph.grad, x.grad)
    hand_params = dict(hand.named_parameters())
    for k, p in st.module(g).named_parameters():
        assert_close(p.grad, hand_params[names[k]].grad, msg=k)


class Add(Node):
    def forward(self, xs, ctx):
        return Done(Opaque(xs[0] + xs[1]))


def test_shared_branches_after_a_predecessor_match_hand_written_torch():
    """``pre >> ((enc >> a) | (enc >> b))`` and the residual ``pre >> ((enc >> blk) | enc) >>
    add``: one ``enc``, fed once by ``pre``."""
    torch.manual_seed(0)
    pre, enc, a, b, blk = (Head(4, 4) for _ in range(5))
    heads = Graph.somatize(pre.with_id("pre") >> ((enc.with_id("enc") >> a) | (enc >> b)))
    residual = Graph.somatize(pre >> ((enc >> blk.with_id("blk")) | enc) >> Add())
    assert heads.edges() == (("enc", "head"), ("enc", "head_2"), ("pre", "enc"))
    x = torch.randn(3, 4)
    lin = {n: node.out for n, node in zip(("pre", "enc", "a", "b", "blk"), (pre, enc, a, b, blk))}
    h = lin["enc"](lin["pre"](x))
    for g, want in ((heads, (lin["a"](h), lin["b"](h))), (residual, (lin["blk"](h) + h,))):
        got = st.module(g)(x)
        got = got if isinstance(got, tuple) else (got,)
        for mine, theirs in zip(got, want, strict=True):
            assert_close(mine, theirs)
        params = st.parameters(g)  # (the hand-written network uses the same modules)
        mine_grads = torch.autograd.grad(sum(t.square().sum() for t in got), params)
        hand = sum(t.square().sum() for t in want)
        hand_grads = torch.autograd.grad(hand, params, retain_graph=True)  # (h is shared)
        for mine, theirs in zip(mine_grads, hand_grads, strict=True):
            assert_close(mine, theirs)


class Held(Node):
    """Applies a module it is given (two nodes may hold one: tied weights)."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net

    def forward(self, x, ctx):
        return Done(Opaque(torch.tanh(self.net(x))))


class HandTwoHeads(nn.Module):
    """One encoder, a square layer applied twice (tied), two heads: two losses."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.tied = nn.Linear(5, 6), nn.Linear(6, 6)
        self.cls, self.reg = nn.Linear(6, 3), nn.Linear(6, 1)

    def forward(self, x):
        h = self.tied(torch.tanh(self.tied(torch.tanh(self.enc(x)))))
        return self.cls(torch.tanh(h)), self.reg(torch.tanh(h))


def test_two_heads_two_losses_and_tied_weights_train_as_hand_written_torch():
    """A shared encoder feeding two heads whose losses are summed, and one module held by
    two nodes (tied weights): outputs, and weights after optimizer steps, equal the plain
    model's — every parameter counted once by st.parameters(g), as by hand.parameters()."""
    torch.manual_seed(0)
    hand = HandTwoHeads()
    start = {k: v.clone() for k, v in hand.state_dict().items()}
    tied = nn.Linear(6, 6)
    g = (
        Graph()
        .node("enc", Held(nn.Linear(5, 6)))
        .node("t1", Held(tied))
        .node("t2", Held(tied))
        .node("cls", Head(6, 3))
        .node("reg", Head(6, 1))
    )
    for a, b in (("enc", "t1"), ("t1", "t2"), ("t2", "cls"), ("t2", "reg")):
        g.edge(a, b)
    names = {"enc.net": "enc", "t1.net": "tied", "cls.out": "cls", "reg.out": "reg"}
    st.load_state(
        g,
        {f"{k}.{p}": start[f"{v}.{p}"] for k, v in names.items() for p in ("weight", "bias")}
        | {f"t2.net.{p}": start[f"tied.{p}"] for p in ("weight", "bias")},
    )
    params = st.parameters(g)
    assert len(params) == len(list(hand.parameters())) == 8  # (the tied layer once)
    model = st.module(g)
    opt_hand = torch.optim.SGD(hand.parameters(), lr=0.1, momentum=0.9)
    opt_graph = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, 5, generator=gen)
        y, z = torch.randint(0, 3, (4,), generator=gen), torch.randn(4, 1, generator=gen)
        for net, opt in ((hand, opt_hand), (model, opt_graph)):
            logits, value = net(x)
            loss = nn.functional.cross_entropy(logits, y) + nn.functional.mse_loss(value, z)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert_close(model(x)[0], hand(x)[0])
    mine = st.state(g)
    for k, v in names.items():
        for p in ("weight", "bias"):
            assert_close(mine[f"{k}.{p}"], hand.state_dict()[f"{v}.{p}"])
    assert torch.equal(mine["t1.net.weight"], mine["t2.net.weight"])  # still one tensor


class Cosine(Node):
    def forward(self, pair, ctx):
        left, right = pair
        return Done(Opaque(nn.functional.cosine_similarity(left, right)))


def test_a_siamese_encoder_of_two_nodes_sharing_modules_matches_hand_written_torch():
    """Two inputs, one encoder's weights: the second node holds the first's module (what
    the error for ``(Pick(0) >> enc) | (Pick(1) >> enc)`` advises), so its gradient is the
    sum of both uses, and st.parameters(g) and the optimizer hold it once."""
    from somatize import Pick as Take  # (this file's Pick is a tower)

    torch.manual_seed(0)
    left, right = Head(5, 4), Head(5, 4)
    right.out = left.out
    g = Graph.somatize(
        ((Take(0) >> left.with_id("left")) | (Take(1) >> right.with_id("right"))) >> Cosine()
    )
    hand = nn.Linear(5, 4)
    hand.load_state_dict(left.out.state_dict())
    params = st.parameters(g)
    assert len(params) == 2 and params[0] is left.out.weight
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    mine = st.module(g)(a, b)
    theirs = nn.functional.cosine_similarity(hand(a), hand(b))
    assert_close(mine, theirs)
    mine.sum().backward()
    theirs.sum().backward()
    assert_close(left.out.weight.grad, hand.weight.grad)
    assert_close(left.out.bias.grad, hand.bias.grad)
