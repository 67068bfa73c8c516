"""What a module holds beside its weights and plain settings — a list or dict of tensors or
modules, a ``partial``, a replaced ``forward``, its forward hooks — and builtin methods
bound to an object: each is read at every key, by content, as a node's own attributes are
(found by an outside audit: these entered by type, or their code once per process, so
a changed scale, hook or slope was served the output computed before).

Each test runs a frozen cached node, changes one thing, and checks the cached result
against the node's module run afresh."""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node

X = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
SCALE = 2.0  # read by `_scaled`, rebound by a test (restored after each)
TABLE = torch.ones(3)  # read by `_times_table`, changed in place by a test


@pytest.fixture(autouse=True)
def _restore() -> Any:
    yield
    globals()["SCALE"] = 2.0
    TABLE.fill_(1.0)


class Wrap(Node):
    def __init__(self, m: Any) -> None:
        self.m = m

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(self.m(x).detach())


def _fresh_after(module: Any, change: Any, per: str = "batch") -> tuple[torch.Tensor, Any]:
    """The cached output after ``change(module)``, and the module run afresh."""
    node = Wrap(module)
    g = Graph(keeper=MemoryKeeper()).node("n", node).freeze("n").cache("n", per=per)
    st.module(g)
    first = g.forward(X)
    change(node.m)
    got = g.forward(X)
    with torch.no_grad():
        want = node.m(X)
    assert not torch.equal(first, want), "the change must change the output"
    return got, want


class Scales(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ws = [torch.ones(3)]
        self.table = {"w": torch.ones(3)}
        self.blocks = [nn.Linear(3, 3)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x) * self.ws[0] * self.table["w"]


def _scale_in_place(m: Scales) -> None:
    with torch.no_grad():
        m.blocks[0].weight.mul_(2)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m, "ws", [torch.full((3,), 5.0)]),
        lambda m: m.table["w"].mul_(3),
        _scale_in_place,
    ],
    ids=["list of tensors replaced", "dict's tensor in place", "listed module's weight"],
)
@pytest.mark.parametrize("per", ["batch", "example"])
def test_tensors_and_modules_in_a_modules_containers_enter_by_content(change, per):
    got, want = _fresh_after(Scales(), change, per)
    torch.testing.assert_close(got, want)


class Act(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = functools.partial(F.leaky_relu, negative_slope=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


def test_a_partial_held_by_a_module_enters_by_its_arguments():
    slope = functools.partial(F.leaky_relu, negative_slope=0.5)
    got, want = _fresh_after(Act(), lambda m: setattr(m, "act", slope))
    torch.testing.assert_close(got, want)


def _tripled(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, self.weight, self.bias) * 3


def test_a_forward_replaced_on_a_module_instance_enters_by_its_code():
    for replace in (types.MethodType, functools.partial):
        got, want = _fresh_after(
            nn.Linear(3, 3), lambda m, r=replace: setattr(m, "forward", r(_tripled, m))
        )
        torch.testing.assert_close(got, want)


def _scaled(m: nn.Module, i: Any, o: torch.Tensor) -> torch.Tensor:
    return o * SCALE


def _times_table(m: nn.Module, i: Any, o: torch.Tensor) -> torch.Tensor:
    return o * TABLE


class Times:
    def __init__(self) -> None:
        self.s = 2.0

    def __call__(self, m: nn.Module, i: Any, o: torch.Tensor) -> torch.Tensor:
        return o * self.s

    def hook(self, m: nn.Module, i: Any, o: torch.Tensor) -> torch.Tensor:
        return o * self.s


def _hooked(hook: Any) -> nn.Linear:
    lin = nn.Linear(3, 3)
    lin.register_forward_hook(hook)
    return lin


def test_a_hook_is_read_at_every_key_with_what_its_code_reads():
    def rebind(m: nn.Module) -> None:
        globals()["SCALE"] = 5.0

    times, bound = Times(), Times()
    cases = [
        (_scaled, rebind),  # a global the hook reads, rebound
        (_times_table, lambda m: TABLE.mul_(4)),  # a tensor it reads, changed in place
        (times, lambda m: setattr(times, "s", 7.0)),  # a callable object's attribute
        (bound.hook, lambda m: setattr(bound, "s", 9.0)),  # a bound method's object's
    ]
    for hook, change in cases:
        got, want = _fresh_after(_hooked(hook), change)
        torch.testing.assert_close(got, want)


def test_a_setting_changed_from_zero_to_negative_zero_is_seen():
    node = Wrap(nn.Threshold(0.5, 0.0))
    g = Graph(keeper=MemoryKeeper()).node("n", node).freeze("n").cache("n")
    st.module(g)
    g.forward(X)
    node.m.value = -0.0  # equal to 0.0, and another output: 1 / x differs
    got = g.forward(X)
    assert bool((1 / got[X <= 0.5] < 0).all())


class Apply(Node):
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(self.fn(x))


def test_builtin_methods_bound_to_different_objects_are_different_nodes():
    keeper = MemoryKeeper()
    outs = []
    for scale in (2.0, 3.0):  # a constructor argument each
        g = Graph(keeper=keeper).node("n", Apply(torch.full((2,), scale).mul)).cache("n")
        st.module(g)
        outs.append(g.forward(torch.ones(2)))
    assert outs[0].tolist() == [2.0, 2.0] and outs[1].tolist() == [3.0, 3.0]
    node = Apply(torch.full((2,), 2.0).mul)  # an attribute, its tensor changed in place
    g = Graph(keeper=keeper).node("n", node).cache("n")
    st.module(g)
    g.forward(torch.ones(2))
    node.fn.__self__.fill_(4.0)
    assert g.forward(torch.ones(2)).tolist() == [4.0, 4.0]


def test_a_library_method_a_ufunc_or_a_partial_may_be_a_constructor_argument():
    import numpy as np

    from somatize.memory import NodeKeys

    def key(fn: Any) -> str:
        return NodeKeys().of(Apply(fn), ["input"])

    assert key(torch.Tensor.relu) == key(torch.Tensor.relu) != key(torch.Tensor.tanh)
    assert key(np.sin) != key(np.cos)
    two, three = (functools.partial(torch.mul, other=k) for k in (2, 3))
    assert key(two) == key(functools.partial(torch.mul, other=2)) != key(three)


class Norm(Node):
    def __init__(self) -> None:
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(self.bn(x).detach())


def test_a_frozen_node_is_keyed_in_the_mode_it_runs_in():
    """Found by an outside audit: frozen after its module was made (or a module of it put
    back in training mode), a node was keyed in training mode and computed in eval mode;
    unfrozen and training, it was served that eval-mode output."""
    for when in ("freeze after module(g)", "train() on the frozen node's module"):
        node = Norm()
        g = Graph(keeper=MemoryKeeper()).node("n", node)
        if when.startswith("freeze"):
            st.module(g)
            g.freeze("n").cache("n")
        else:
            g.freeze("n").cache("n")
            st.module(g)
            node.bn.train()
        frozen = g.forward(X)
        g.freeze("n", False)
        node.bn.train()
        with warnings.catch_warnings():  # (batch norm training moves its running statistics)
            warnings.simplefilter("ignore", UserWarning)
            trained = g.forward(X)
        with torch.no_grad():
            assert torch.equal(trained, node.bn.train()(X)), when
        assert not torch.equal(trained, frozen), when
