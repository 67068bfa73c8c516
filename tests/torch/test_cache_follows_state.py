"""A cached node's key follows everything its output depends on: a hit always equals
recomputing. Each test changes one thing a frozen, cached node's output depends on and
checks the cached result against the node run afresh (found by an outside audit)."""

from __future__ import annotations

import collections
import dataclasses
import types
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import somatize.explain as records
import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque
from somatize.errors import CacheError
from somatize.values import decode, encode


class Enc(Node):
    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(0.1))

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


def cached(node: Node, per: str = "example") -> Graph:
    g = Graph(keeper=MemoryKeeper()).node("enc", node)
    g.freeze("enc").cache("enc", per=per)
    st.module(g)
    return g


def fresh(node: Node, x: torch.Tensor) -> Any:
    with torch.no_grad():
        return node.forward(x, None).value.value


X = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)) - 1


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_write_that_moves_no_version_counter_is_seen_after_module(per):
    node = Enc()
    g = cached(node, per)
    g.forward(X)
    node.net[0].weight.data.mul_(2)  # .data: the version counter does not move
    st.module(g)  # (as every fit does)
    assert torch.equal(g.forward(X), fresh(node, X))


def test_a_fused_optimizer_step_between_fits_is_seen():
    node = Enc()
    g = cached(node)
    g.forward(X)
    opt = torch.optim.Adam(node.net.parameters(), lr=0.1, fused=True)
    node.net[0].weight.grad = torch.ones_like(node.net[0].weight)
    opt.step()  # fused kernels write the weights without moving their version counters
    st.module(g)
    assert torch.equal(g.forward(X), fresh(node, X))


@pytest.mark.parametrize("per", ["example", "batch"])
def test_autocast_enters_the_key(per):
    node = Enc()
    g = cached(node, per)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = g.forward(X)
        assert low.dtype == torch.bfloat16
    full = g.forward(X)  # not the bf16 rows
    assert full.dtype == torch.float32 and torch.equal(full, fresh(node, X))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again = g.forward(X)  # the bf16 rows are found again
        assert again.dtype == torch.bfloat16 and torch.equal(again, low)


@pytest.mark.parametrize("per", ["example", "batch"])
def test_explain_tells_a_change_of_autocast_from_one_of_weights(per):
    node = Enc()
    g = cached(node, per)
    g.forward(X)  # float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert g.explain(X)["enc"].changed == ("context (autocast cpu torch.bfloat16, was off)",)
        with torch.no_grad():
            node.net[0].weight.mul_(2)
        assert g.explain(X)["enc"].changed == (
            "state (weights or held data)",
            "context (autocast cpu torch.bfloat16, was off)",
        )
    assert g.explain(X)["enc"].changed == ("state (weights or held data)",)


def test_explain_reads_a_record_written_before_contexts_were_recorded():
    g = cached(Enc(), "batch")
    g.forward(X)
    notes = records._notes(g.keeper)
    assert isinstance(notes, dict)
    slot = records._slot("enc")
    record = decode(notes[slot])
    assert record.pop("context") is None
    notes[slot] = encode(record)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert g.explain(X)["enc"].changed == ("state (weights or held data)",)


# -- what a node holds, however it holds it ----------------------------------------------


class Pair(NamedTuple):
    net: nn.Module
    scale: float


@dataclasses.dataclass
class Box:
    net: nn.Module


class InContainer(Node):
    """Holds its module in a container other than a list, tuple or dict."""

    def __init__(self, how: str) -> None:
        lin = nn.Linear(8, 8)
        self.how = how
        if how == "OrderedDict":
            self.held = collections.OrderedDict(a=lin)
        elif how == "namedtuple":
            self.held = Pair(lin, 1.0)
        else:
            self.held = Box(lin)

    def lin(self) -> nn.Module:
        if self.how == "OrderedDict":
            return self.held["a"]
        return self.held.net

    def forward(self, x, ctx):
        return Done(Opaque(self.lin()(x)))


@pytest.mark.parametrize("how", ["OrderedDict", "namedtuple", "dataclass"])
def test_a_module_in_any_container_is_registered_frozen_and_keyed(how):
    node = InContainer(how)
    g = cached(node)
    assert not any(p.requires_grad for p in node.lin().parameters())  # the freeze reached it
    assert len(list(st.module(g).parameters())) == 2
    g.forward(X)
    with torch.no_grad():
        node.lin().weight.add_(1)
    assert torch.equal(g.forward(X), fresh(node, X))


class Settings(Node):
    """Reads plain settings of its modules, a function attribute and a config object."""

    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(0.1))
        self.act = torch.relu
        self.dtype = torch.float32
        self.cfg = types.SimpleNamespace(shift=0.0)
        self.names = {"a"}

    def forward(self, x, ctx):
        y = self.net(x.to(self.dtype).float()) + self.act(x) + self.cfg.shift + len(self.names)
        return Done(Opaque(y))


def _square(x):
    return x * x


CHANGES = {
    "a module's plain attribute": lambda n: setattr(n.net[1], "negative_slope", 0.9),
    "a forward hook": lambda n: n.net.register_forward_hook(lambda m, i, o: o + 1),
    "a function attribute": lambda n: setattr(n, "act", torch.tanh),
    "a user function attribute": lambda n: setattr(n, "act", _square),
    "a dtype attribute": lambda n: setattr(n, "dtype", torch.float16),
    "a config object": lambda n: setattr(n.cfg, "shift", 1.0),
    "a set, mutated": lambda n: n.names.add("b"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_setting_the_output_depends_on_enters_the_key(change):
    node = Settings()
    g = cached(node, "batch")
    before = g.forward(X)
    CHANGES[change](node)
    after = g.forward(X)
    expected = fresh(node, X)
    assert torch.equal(after, expected) and not torch.equal(after, before)


class Holder(Node):
    def __init__(self, inner: Node) -> None:
        self.inner = inner

    def forward(self, x, ctx):
        return self.inner.forward(x, ctx)


class Double(Node):
    def forward(self, x, ctx):
        return Done(x * 2)


class Triple(Node):
    def forward(self, x, ctx):
        return Done(x * 3)


def test_a_held_node_swapped_for_another_class_is_seen():
    node = Holder(Double())
    g = Graph(keeper=MemoryKeeper()).node("h", node).cache("h")
    assert g.forward(2) == 4
    node.inner = Triple()  # no state of its own either: only its class tells them apart
    assert g.forward(2) == 6


def _net_class(body: str) -> type:
    """A module class named ``Net`` in this test module, from source with no file."""
    scope: dict[str, Any] = {"nn": nn, "__name__": __name__}
    exec(f"class Net(nn.Module):\n    def forward(self, x):\n        return {body}\n", scope)
    return scope["Net"]


def test_a_user_module_class_enters_by_its_code():
    codec = st.TensorCodec()
    one, two = _net_class("x + 1")(), _net_class("x * 2")()
    assert type(one).__qualname__ == type(two).__qualname__ == "Net"
    assert codec.fingerprint(one) != codec.fingerprint(two)
    assert codec.fingerprint(one) == codec.fingerprint(_net_class("x + 1")())


def test_an_empty_batch_through_a_node_cached_per_example_is_computed():
    node = Enc()
    g = cached(node)
    out = g.forward(torch.empty(0, 8))
    assert out.shape == (0, 8)
    assert torch.equal(g.forward(X), fresh(node, X))  # and the next batch is remembered as usual


class Noisy(Node):
    def __init__(self) -> None:
        self.drop = nn.Dropout(0.5)

    def forward(self, x, ctx):
        return Done(Opaque(self.drop(x)))


def test_a_node_frozen_after_module_runs_in_eval_mode_and_remembers_no_dropout_mask():
    node = Noisy()
    g = Graph(keeper=MemoryKeeper()).node("enc", node)
    st.module(g)  # made before the freeze: its modules are still in training mode
    g.freeze("enc").cache("enc", per="example")
    assert torch.equal(g.forward(X), X) and torch.equal(g.forward(X), X)  # no dropout
    assert not node.drop.training


@pytest.mark.parametrize("per", ["example", "batch"])
@pytest.mark.parametrize("cached", [True, False])
def test_a_frozen_node_put_back_in_training_mode_later_still_runs_in_eval_mode(per, cached):
    node = Noisy()
    g = Graph(keeper=MemoryKeeper()).node("enc", node).freeze("enc")
    if cached:
        g.cache("enc", per=per)
    m = st.module(g)
    assert torch.equal(m(X), X)
    node.drop.train()  # the user's own handle on the module, after the first call
    torch.manual_seed(0)
    assert torch.equal(m(X + 1), X + 1)  # a miss: computed in eval mode, no mask kept
    assert not node.drop.training
    node.drop = nn.Dropout(0.5)  # a module swapped in (in training mode, as made)
    assert torch.equal(m(X + 2), X + 2) and torch.equal(m(X + 2), X + 2)
    assert torch.equal(m(X + 1), X + 1)  # the earlier rows: hits or computed, unmasked


class ReGrad(Node):
    """A frozen node whose forward turns grad back on: its output requires grad."""

    def __init__(self) -> None:
        self.lin = nn.Linear(8, 4)

    def forward(self, x, ctx):
        with torch.enable_grad():
            return Done(Opaque(self.lin(x) * torch.ones(1, requires_grad=True)))


@pytest.mark.parametrize("per", ["example", "batch"])
def test_the_errors_of_what_cannot_be_keyed_give_fixes_that_apply(per):
    g = cached(ReGrad(), per)
    with pytest.raises(CacheError, match=r"'enc' is frozen, so.*enable_grad") as info:
        g.forward(X)
    assert "freeze 'enc'" not in str(info.value)  # it is frozen already
    with pytest.raises(CacheError, match=r"the graph input, is Opaque.*x\.detach\(\)"):
        st.module(cached(Enc(), per))(X.clone().requires_grad_())


class Fields(Node):
    """Returns a dict whose insertion order is not sorted: code may read it in order."""

    def forward(self, x, ctx):
        return Done({"zz": x + 1, "a": x - 1})


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_dict_output_comes_back_in_one_order_hit_or_miss(per):
    g = Graph(keeper=MemoryKeeper()).node("f", Fields()).freeze("f").cache("f", per=per)
    st.module(g)
    miss, hit = g.forward(X), g.forward(X)
    assert list(miss) == list(hit)
    assert torch.equal(torch.cat(list(miss.values())), torch.cat(list(hit.values())))


def test_tuple_settings_enter_by_value_and_a_tensor_in_one_does_not_break_the_memo():
    codec = st.TensorCodec()
    conv = nn.Conv2d(1, 2, 3)
    before = codec.fingerprint(conv)
    assert codec.fingerprint(conv) == before  # served from the memo
    conv.padding = (1, 1)
    assert codec.fingerprint(conv) != before
    odd = nn.Identity()
    odd.pair = (torch.ones(2), 3)  # (== between tuples holding tensors would raise)
    first = codec.fingerprint(odd)
    assert codec.fingerprint(odd) == first
    odd.pair = (torch.zeros(2), 3)
    assert codec.fingerprint(odd) != first


def test_a_buffer_made_under_inference_mode_is_hashed_every_time():
    node = Enc()
    with torch.inference_mode():
        node.net[0].register_buffer("offset", torch.zeros(8))  # no version counter
    g = cached(node)
    first = g.forward(X)
    assert torch.equal(first, fresh(node, X))
    codec = next(c for c in g.codecs if isinstance(c, st.TensorCodec))
    hashed = codec.hashed
    assert torch.equal(g.forward(X), first)
    assert codec.hashed > hashed  # no memo for it: hashed again


def test_a_batch_that_is_not_rows_is_named_by_its_odd_item():
    g = cached(Enc())
    with pytest.raises(CacheError, match=r"a tuple whose item 1 is an int"):
        g.forward((X, 3))
    with pytest.raises(CacheError, match=r"torch\.from_numpy"):
        g.forward(X.numpy())


def test_a_public_attribute_added_to_a_module_enters_its_fingerprint():
    codec = st.TensorCodec()
    one, two = nn.ReLU(), nn.ReLU()
    first = codec.fingerprint(one)
    assert codec.fingerprint(two) == first  # one class, one layout: the names are found once
    two.scale = 2.0  # a new attribute: the instance's layout differs
    assert codec.fingerprint(two) != first
    assert codec.fingerprint(one) == first


SHIFT = torch.zeros(3)  # a module-level constant the node below reads (its normalisation)
SCALE = [1.0, 1.0, 1.0]


class Normalise(Node):
    """Reads a global tensor, as a backbone normalising with dataset statistics does."""

    rowwise = True

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque((x - SHIFT) * torch.tensor(SCALE)))


def test_a_global_tensor_a_node_reads_enters_its_key_by_content() -> None:
    """Another SHIFT (as a new process computing other statistics would see it) is a miss,
    not the rows of the old one; an equal one is a hit."""
    global SHIFT
    keeper, x = MemoryKeeper(), torch.randn(4, 3)

    def run() -> tuple[torch.Tensor, dict[str, Any]]:
        g = Graph.somatize(Normalise().with_id("norm"), keeper=keeper)
        g.freeze("norm").cache("norm", per="example")
        st.module(g)
        return g.forward(x), keeper.stats().entries

    try:
        first, entries = run()
        assert torch.equal(first, x) and entries == 4
        SHIFT = torch.full((3,), 0.5)
        second, entries = run()
        assert torch.equal(second, x - 0.5) and entries == 8  # computed, not recalled
        SHIFT = torch.full((3,), 0.5)  # equal content, another tensor: the same key
        third, entries = run()
        assert torch.equal(third, x - 0.5) and entries == 8
    finally:
        SHIFT = torch.zeros(3)
