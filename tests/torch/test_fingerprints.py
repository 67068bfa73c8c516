"""A module's fingerprint (``somatize/torch/fingerprints.py``): what of a module a cached
node's key sees, checked against the module run afresh."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque


class Scaled(nn.Module):
    """A user module keeping a setting in a private attribute, as many do (``self._eps``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self._scale = 2.0

    def forward(self, x):
        return self.lin(x) * self._scale


class Enc(Node):
    def __init__(self) -> None:
        self.net = Scaled()

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_private_attribute_of_a_user_module_enters_the_key(per):
    node, x = Enc(), torch.randn(4, 3)
    g = Graph(keeper=MemoryKeeper()).node("enc", node).freeze("enc").cache("enc", per=per)
    st.module(g)
    before = g.forward(x)
    node.net._scale = 3.0
    with torch.no_grad():
        expected = node.net(x)
    after = g.forward(x)
    assert torch.equal(after, expected) and not torch.equal(after, before)


def test_the_private_tables_of_nn_module_and_of_library_modules_do_not():
    codec = st.TensorCodec()
    mine, relu = Scaled(), nn.ReLU()
    first, plain = codec.fingerprint(mine), codec.fingerprint(relu)
    mine.register_forward_hook(lambda m, i, o: None)  # (a hook enters as a hook, as before)
    mine._forward_hooks.clear()
    assert codec.fingerprint(mine) == first
    relu._private = 1  # a library module's internals: its constructor made them
    assert codec.fingerprint(relu) == plain


def test_two_instances_of_one_size_with_other_attributes_are_told_apart():
    """The names are found once per class and size of ``__dict__``: an instance with a
    private attribute (left out) must not hide another's public one of the same size."""
    codec = st.TensorCodec()
    one, two = nn.Tanh(), nn.Tanh()
    one._tag = "tooling"  # (as libraries mark modules: _is_hf_initialized)
    codec.fingerprint(one)
    two.scale = 2.0
    first = codec.fingerprint(two)
    two.scale = 3.0
    assert codec.fingerprint(two) != first


class Boosted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.k = 2.0

    def forward(self, x):
        return self.lin(x) * self.k * getattr(self, "boost", 1.0)


def test_a_compiled_instance_does_not_hide_a_siblings_setting():
    """``.compile()`` adds ``_compiled_call_impl`` to one instance: another of the same
    ``__dict__`` size holding a setting in its place was fingerprinted without it."""
    codec = st.TensorCodec()
    compiled = Boosted()
    compiled.compile(backend="eager")  # (compiles nothing until called)
    codec.fingerprint(compiled)
    other = Boosted()
    other.boost = 1.0
    first = codec.fingerprint(other)
    other.boost = 10.0
    assert codec.fingerprint(other) != first
    assert codec.fingerprint(compiled) == codec.fingerprint(compiled)


def offset(x):
    return x + 1


class Offset(nn.Module):
    """A user module whose forward calls a helper of this module."""

    def forward(self, x):
        return offset(x)


def test_a_helper_a_user_module_calls_redefined_later_is_seen():
    me = sys.modules[__name__]
    codec, helper = st.TensorCodec(), offset
    mod = Offset()
    first = codec.fingerprint(mod)
    try:
        me.offset = lambda x: x - 1  # (as `def offset` run again in a notebook)
        assert codec.fingerprint(mod) != first
    finally:
        me.offset = helper
    assert codec.fingerprint(mod) == first


class Configured(nn.Module):
    """A module holding a library's settings object (a HuggingFace model's ``config``)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = argparse.Namespace(scale=2.0, output_hidden=False)

    def forward(self, x):
        return x * self.config.scale


def test_a_plain_setting_of_a_library_object_a_module_holds_enters_its_fingerprint():
    codec, mod = st.TensorCodec(), Configured()
    first = codec.fingerprint(mod)
    mod.config.scale = 3.0
    assert codec.fingerprint(mod) != first


def test_a_generator_a_module_holds_enters_by_its_state():
    codec, mod = st.TensorCodec(), nn.Identity()
    mod.gen = torch.Generator().manual_seed(0)
    first = codec.fingerprint(mod)
    torch.randn(3, generator=mod.gen)
    assert codec.fingerprint(mod) != first


def test_settings_remembered_by_identity_still_see_every_change():
    """A module's plain settings are remembered while its ``__dict__`` holds the very same
    objects (``_settings``): an equal tuple made anew, a value of another type, a setting
    added or a left-out attribute removed are each read again."""
    codec = st.TensorCodec()
    conv = nn.Conv2d(1, 2, 3, padding=1)
    first = codec.fingerprint(conv)
    assert codec.fingerprint(conv) == first  # (the remembered path)
    conv.padding = (1, 1)  # equal, another object: read again, the same fingerprint
    assert codec.fingerprint(conv) == first
    conv.padding = (2, 2)
    moved = codec.fingerprint(conv)
    assert moved != first
    conv.padding = (1.0, 1.0)  # equal to (1, 1), another type: another fingerprint
    assert codec.fingerprint(conv) not in (first, moved)
    conv.padding = (1, 1)
    assert codec.fingerprint(conv) == first
    conv.groups = True  # == 1, another type
    assert codec.fingerprint(conv) != first
    conv.groups = 1
    del conv._reversed_padding_repeated_twice  # a left-out attribute gone: no error
    assert codec.fingerprint(conv) == first
    conv.extra = 5  # a setting added
    assert codec.fingerprint(conv) != first


def test_a_setting_that_can_change_in_place_is_read_at_every_fingerprint():
    """Only immutable settings are remembered by identity: a list changed in place is seen."""
    codec = st.TensorCodec()
    act = nn.ReLU()
    act.sizes = [1, 2]
    first = codec.fingerprint(act)
    assert codec.fingerprint(act) == first
    act.sizes.append(3)
    assert codec.fingerprint(act) != first


def test_a_held_objects_setting_changed_in_type_alone_is_a_new_fingerprint():
    """An object a module holds enters by its plain settings: ``scale`` 1 then 1.0 (equal
    by ``==``, which the fingerprint's memo compares with) is a change."""
    codec = st.TensorCodec()
    act = nn.ReLU()
    act.cfg = argparse.Namespace(scale=1)
    first = codec.fingerprint(act)
    act.cfg.scale = 1.0
    assert codec.fingerprint(act) != first
    act.cfg.scale = 1
    assert codec.fingerprint(act) == first


def test_a_setting_tuple_holding_a_list_enters_by_content_and_does_not_crash():
    """``([3, 3], 1)`` cannot be hashed: looking it up among the plain tuples seen raised
    ``TypeError: unhashable type: 'list'`` at every key of a node holding the module."""
    codec = st.TensorCodec()
    act = nn.ReLU()
    act.spec = ([3, 3], 1)
    first = codec.fingerprint(act)
    act.spec[0].append(3)  # in place: seen
    assert codec.fingerprint(act) != first
    act.spec[0].pop()
    assert codec.fingerprint(act) == first
