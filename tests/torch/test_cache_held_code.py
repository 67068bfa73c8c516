"""A cached node given code — a function, a lambda, a closure, as a constructor argument or
an attribute — keys what that code reads by content: a module's weights, a tensor, an
array, through the graph's codecs (found by an outside audit: they entered by type alone,
so a new checkpoint loaded into a backbone a lambda calls was served the old rows).

Each test runs the cached node, changes what the code reads, and checks the cached
result against the code run afresh."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node

X = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
MEAN = torch.zeros(16)  # read by `normalize`, rebound by the tests (restored after each)


@pytest.fixture(autouse=True)
def _restore_mean() -> Any:
    yield
    globals()["MEAN"] = torch.zeros(16)


def normalize(t: torch.Tensor) -> torch.Tensor:
    return t - MEAN


class Features(Node):
    """A frozen feature extractor given its function (stored as an attribute)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def forward(self, t, ctx):
        return Done(self.fn(t))


class Later(Node):
    """The function set as an attribute after construction: the state path alone."""

    def __init__(self) -> None:
        self.fn: Any = None

    def forward(self, t, ctx):
        return Done(self.fn(t))


def cached(node: Node, keeper: Any, per: str = "example") -> nn.Module:
    g = Graph.somatize(node.with_id("enc"), keeper=keeper)
    return st.module(g.freeze("enc").cache("enc", per=per))


@pytest.mark.parametrize("per", ["example", "batch"])
def test_a_closure_over_a_backbone_follows_a_new_checkpoint_in_the_same_graph(per):
    torch.manual_seed(0)
    backbone = nn.Linear(16, 8)
    m = cached(Features(lambda t: backbone(t)), MemoryKeeper(), per)
    first = m(X)
    with torch.no_grad():
        assert torch.equal(first, backbone(X))
    backbone.load_state_dict({"weight": torch.randn(8, 16), "bias": torch.zeros(8)})
    got = m(X)  # the same graph: the module the closure reads is asked again
    with torch.no_grad():
        assert torch.equal(got, backbone(X)) and not torch.equal(got, first)


def test_a_closure_over_a_backbone_follows_a_new_checkpoint_in_a_new_graph():
    torch.manual_seed(0)
    backbone, keeper = nn.Linear(16, 8), MemoryKeeper()
    extract = lambda t: backbone(t)  # noqa: E731 -- the audit's closure, as a user writes it
    cached(Features(extract), keeper)(X)
    backbone.load_state_dict({"weight": torch.randn(8, 16), "bias": torch.zeros(8)})
    got = cached(Features(extract), keeper)(X)
    with torch.no_grad():
        assert torch.equal(got, backbone(X))


@pytest.mark.parametrize("node", [lambda: Features(normalize), lambda: Later()])
def test_a_helper_reading_a_global_tensor_follows_its_rebinding_in_a_new_graph(node):
    global MEAN
    keeper = MemoryKeeper()

    def make() -> Node:
        n = node()
        n.fn = normalize
        return n

    assert torch.equal(cached(make(), keeper)(X), X)
    MEAN = torch.ones(16)
    assert torch.equal(cached(make(), keeper)(X), X - 1)


def test_a_helper_reading_a_global_tensor_follows_an_in_place_write_in_the_same_graph():
    m = cached(Features(normalize), MemoryKeeper())
    assert torch.equal(m(X), X)
    MEAN.add_(2.0)  # in place: the same object, a new version
    assert torch.equal(m(X), X - 2)


def test_an_unchanged_helper_is_a_hit_and_its_reads_are_not_hashed_again():
    torch.manual_seed(0)
    backbone = nn.Linear(16, 8)
    g = Graph.somatize(Features(lambda t: backbone(t)).with_id("enc"), keeper=MemoryKeeper())
    m = st.module(g.freeze("enc").cache("enc", per="example"))
    m(X)
    codec = next(c for c in g.codecs if isinstance(c, st.TensorCodec))
    hashed = codec.hashed
    out = m(X)
    with torch.no_grad():
        assert torch.equal(out, backbone(X))
    assert codec.hashed == hashed  # the weights' digests came from the version memo


def test_a_helper_reading_what_no_codec_sees_warns_naming_the_node_and_the_function():
    import threading

    lock = threading.Lock()

    def guarded(t: torch.Tensor) -> torch.Tensor:
        with lock:
            return t + 1

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        n = Later()
        n.fn = guarded
        assert torch.equal(cached(n, MemoryKeeper())(X), X + 1)
    messages = [str(w.message) for w in seen if "enters its key by type" in str(w.message)]
    assert any("Later" in s and "guarded" in s and "lock" in s for s in messages), messages


def test_two_processes_sharing_a_disk_keeper_get_rows_of_their_own_weights(tmp_path):
    script = f"""
import sys, torch
from torch import nn
sys.path.insert(0, {str(tmp_path)!r})
import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node
torch.set_num_threads(1)
class Features(Node):
    def __init__(self, fn): self.fn = fn
    def forward(self, t, ctx): return Done(self.fn(t))
torch.manual_seed(int(sys.argv[1]))
backbone = nn.Linear(16, 8)
g = Graph.somatize(Features(lambda t: backbone(t)).with_id("enc"),
                   keeper=DiskKeeper({str(tmp_path / "cache")!r}))
m = st.module(g.freeze("enc").cache("enc", per="example"))
x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    assert torch.equal(m(x), backbone(x)), "served another process's rows"
print("ok")
"""
    import subprocess

    for seed in ("0", "1"):  # different weights, the same inputs and code
        out = subprocess.run(
            [sys.executable, "-c", script, seed], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    assert DiskKeeper(str(tmp_path / "cache")).stats().entries == 16  # 8 rows each
