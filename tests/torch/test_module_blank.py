"""``blank(cls)``: an ``nn.Module`` without ``nn.Module.__init__``, equal to one made normally;
and ``module(g)`` making its per-node modules that way."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.torch import blank as blank_module
from somatize.torch.blank import blank, lazy, maker
from somatize.torch.holdings import Holdings, _Mirror, _mirrored


class Plain(nn.Module):
    """A subclass adding nothing in ``__init__``, as ``Holdings`` does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)  # (once a test gave it one)


@lazy
class LazyPlain(Plain):
    """The same, its blank instances making their hook tables on first touch."""


OWN = {"training", "_parameters", "_buffers", "_modules"}


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, nn.Module):
        return True  # (children: compared through their own attributes where it matters)
    return bool(a == b)


def assert_same_attributes(made: nn.Module, normal: nn.Module) -> None:
    """Attribute for attribute: the same names in the same order, types and values, and
    every container a fresh one (shared with neither the other module nor the template)."""
    a, b = vars(made), vars(normal)
    assert list(a) == list(b)
    for name, value in a.items():
        other = b[name]
        assert same(value, other), name
        if isinstance(value, (dict, set, list)):
            assert value is not other, name


def assert_same_reads(made: nn.Module, normal: nn.Module) -> None:
    """What every attribute of ``normal`` reads as, ``made`` reads as too (made on first
    touch where lazy): the same types and values, each container its own, and the same
    object on every later read."""
    for name, value in vars(normal).items():
        got = getattr(made, name)
        assert same(got, value), name
        if isinstance(value, (dict, set, list)):
            assert got is not value and getattr(made, name) is got, name


def test_a_blank_module_equals_one_constructed_normally() -> None:
    made, normal = blank(Plain), Plain()
    assert type(made) is Plain
    assert_same_attributes(made, normal)
    assert_same_attributes(blank(nn.Module), nn.Module())
    assert blank_module._made is not None  # this torch's nn.Module is one blank can copy


def test_blank_modules_share_no_container() -> None:
    """A hook, a buffer or a child given to one blank module reaches no other."""
    a, b = blank(Plain), blank(Plain)
    for name, value in vars(a).items():
        if isinstance(value, (dict, set)):
            assert value is not vars(b)[name], name
    a.register_forward_hook(lambda *args: None)
    a.register_forward_pre_hook(lambda *args: None, prepend=True)  # (OrderedDict.move_to_end)
    a.register_state_dict_pre_hook(lambda *args: None)
    a.register_buffer("kept", torch.ones(1), persistent=False)
    a.add_module("child", nn.Linear(1, 1))
    assert len(a._forward_hooks) == len(a._forward_pre_hooks) == 1
    assert not (b._forward_hooks or b._forward_pre_hooks or b._state_dict_pre_hooks)
    assert not (b._buffers or b._modules or b._non_persistent_buffers_set)
    assert_same_attributes(b, Plain())


def test_a_lazy_blank_module_holds_four_attributes_and_reads_as_a_normal_one() -> None:
    made = blank(LazyPlain)
    assert set(vars(made)) == OWN  # the hook tables: not made until touched
    assert "_forward_hooks" not in vars(made)
    assert_same_reads(made, LazyPlain())
    constants = {n for n, v in vars(nn.Module()).items() if not isinstance(v, (dict, set))}
    # every container made once read; constants (_is_full_backward_hook) read from the class
    assert set(vars(made)) == set(vars(LazyPlain())) - (constants - OWN)
    assert_same_reads(blank(LazyPlain), nn.Module())


def test_lazy_blank_modules_share_no_container() -> None:
    a, b = blank(LazyPlain), blank(LazyPlain)
    a.register_forward_hook(lambda *args: None)
    a.register_forward_pre_hook(lambda *args: None, prepend=True)
    a.register_state_dict_pre_hook(lambda *args: None)
    a.register_buffer("kept", torch.ones(1), persistent=False)
    assert len(a._forward_hooks) == len(a._forward_pre_hooks) == len(a._state_dict_pre_hooks) == 1
    assert not (b._forward_hooks or b._forward_pre_hooks or b._state_dict_pre_hooks)
    assert not (b._buffers or b._non_persistent_buffers_set) and a._non_persistent_buffers_set
    assert_same_reads(b, LazyPlain())
    normal = LazyPlain()  # the ordinary constructor: everything in the instance, as always
    assert set(vars(normal)) == set(vars(nn.Module())) and not normal._forward_hooks


@pytest.mark.parametrize("cls", [Plain, LazyPlain])
def test_a_blank_module_works_as_a_module(cls: type[nn.Module]) -> None:
    """Registration, modes, state_dict, .to(), copies, pickles and hooks behave as for ``cls()``."""
    made, normal = blank(cls), cls()
    for m in (made, normal):
        m.add_module("lin", nn.Linear(2, 2))
        m.register_buffer("scale", torch.ones(2))
    normal.load_state_dict(made.state_dict())
    assert (
        list(made.state_dict()) == list(normal.state_dict()) == ["scale", "lin.weight", "lin.bias"]
    )
    made.eval()
    assert not made.training and not made.lin.training
    made.to(torch.float64)
    assert made.lin.weight.dtype == torch.float64 and made.scale.dtype == torch.float64
    for twin in (copy.deepcopy(made), pickle.loads(pickle.dumps(made))):
        assert_same_reads(twin, made)
        assert torch.equal(twin.lin.weight, made.lin.weight)
    calls: list[str] = []
    made.lin.register_forward_hook(lambda *args: calls.append("hook"))
    made.lin(torch.ones(1, 2, dtype=torch.float64))
    made.register_forward_pre_hook(lambda *args: calls.append("own pre-hook"))
    made.register_forward_hook(lambda *args: calls.append("own hook"))
    made(torch.ones(1, 2, dtype=torch.float64))
    made.register_state_dict_post_hook(lambda *args: calls.append("state"))
    made.register_load_state_dict_post_hook(lambda *args: calls.append("load"))
    made.load_state_dict(made.state_dict())
    assert calls == ["hook", "own pre-hook", "hook", "own hook", "state", "load"]


def test_blank_falls_back_to_the_constructor_for_an_attribute_it_cannot_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_init = nn.Module.__init__

    def init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        object.__setattr__(self, "_unknown", [])  # a container blank does not know how to copy

    monkeypatch.setattr(nn.Module, "__init__", init)
    assert blank_module._recipe() is None
    monkeypatch.setattr(blank_module, "_made", None)
    made = blank(Plain)
    assert made._unknown == [] and made._unknown is not Plain()._unknown

    class Later(nn.Module):
        pass

    assert lazy(Later) is Later and Later not in blank_module._LAZY  # left as it is
    assert "_forward_hooks" not in vars(Later) and vars(blank(Later))["_unknown"] == []


@pytest.mark.parametrize("cls", [Plain, LazyPlain])
def test_maker_makes_a_blank_module_holding_the_attributes_given(cls: type[nn.Module]) -> None:
    make = maker(cls, "tag", "names")
    made, other = make("x", ()), make("y", ("a",))
    assert type(made) is cls and (made.tag, made.names, other.tag) == ("x", (), "y")
    reference = blank(cls)
    assert list(vars(made)) == [*vars(reference), "tag", "names"]
    assert_same_reads(made, cls())
    made.add_module("lin", nn.Linear(2, 2))
    assert not other._modules and not reference._modules  # containers: each its own


def test_maker_falls_back_to_blank_for_an_attribute_it_cannot_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_init = nn.Module.__init__

    def init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        object.__setattr__(self, "_unknown", [])

    monkeypatch.setattr(nn.Module, "__init__", init)
    monkeypatch.setattr(blank_module, "_made", None)
    made = maker(Plain, "tag")("x")
    assert made.tag == "x" and made._unknown == [] and isinstance(made._forward_hooks, dict)


class Lin(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.lin(x) * self.scale))


class Free(Node):  # holds nothing: no module of its own
    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(x))


def test_module_of_a_graph_runs_no_module_constructor_per_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over 50 nodes, ``module(g)`` constructs two modules (``GraphModule`` and the node
    table): each node's module is made by ``blank``, equal to a normally constructed one."""
    g = Graph.somatize(Lin() >> Free() >> Lin() >> Lin() >> Lin() >> Free())
    chain: Any = Lin()
    for _ in range(49):
        chain = chain >> Lin()
    big = Graph.somatize(chain)
    inits: list[str] = []
    real_init = nn.Module.__init__

    def counting(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        inits.append(type(self).__name__)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "__init__", counting)
    m = st.module(big)
    assert sorted(inits) == ["GraphModule", "_Nodes"]
    assert len(m._modules) == 50
    for held in m._modules.values():
        assert set(vars(held)) == OWN | {"_impl"}  # no hook table yet
        normal = Holdings()
        object.__setattr__(normal, "_impl", held._impl)
        assert type(held._parameters) is _Mirror  # (Lin holds a bare parameter)
        _mirrored(normal)
        normal._parameters.update(held._parameters)
        normal._modules.update(held._modules)
        assert_same_reads(held, normal)
    small = st.module(g)
    assert sorted(small._modules) == ["lin", "lin_2", "lin_3", "lin_4"]  # nothing for Free
    assert list(small.state_dict())[:3] == ["lin.scale", "lin.lin.weight", "lin.lin.bias"]
    assert type(small.lin._parameters) is _Mirror and small.lin._parameters.impl is g["lin"]
    small.to(torch.float64)  # the node's own parameter follows the module
    assert g["lin"].scale.dtype == torch.float64 and g["lin"].scale is small.lin.scale
    assert isinstance(small.lin._forward_hooks, OrderedDict)
