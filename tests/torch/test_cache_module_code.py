"""TorchScript and torch.fx modules enter a fingerprint by the code they run
(``somatize/torch/module_code.py``; found by an outside audit: their classes are torch's,
so two exports of two versions of an encoder, made from one checkpoint, shared rows)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
from torch import nn

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque
from somatize.node_state import state
from somatize.torch import module_code
from somatize.torch.codecs import default_codecs

# torch.jit is deprecated (torch 2.10+), and still what many exported backbones are
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated")

X = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

ENCODER = """
    import torch
    from torch import nn

    def pool(h):
        return {pool}

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.k = 2.0

        def forward(self, x):
            return pool(self.lin(x)) * self.k
    """
MEAN, FIRST = "h.mean(-1, keepdim=True)", "h[:, :1]"


def script(m: nn.Module, path: Any) -> Any:
    torch.jit.save(torch.jit.script(m), path)
    return torch.jit.load(path)


def trace(m: nn.Module, path: Any) -> Any:
    torch.jit.save(torch.jit.trace(m, X), path)
    return torch.jit.load(path)


def fx(m: nn.Module, path: Any) -> Any:
    return torch.fx.symbolic_trace(m)


class Backbone(Node):
    def __init__(self, net: Any) -> None:
        self.net = net

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.net(x)))


@pytest.mark.parametrize("export", [script, trace, fx])
def test_two_exports_of_two_versions_of_the_code_do_not_share_rows(export, user_module, tmp_path):
    torch.manual_seed(0)
    weights = user_module("enc_code", ENCODER.format(pool=MEAN)).Encoder().state_dict()
    keeper = DiskKeeper(tmp_path / "cache")
    prints = []
    for i, pool in enumerate((MEAN, FIRST)):
        enc = user_module("enc_code", ENCODER.format(pool=pool)).Encoder()
        enc.load_state_dict(weights)
        node = Backbone(export(enc, tmp_path / f"enc{i}.pt"))
        g = Graph(keeper=keeper).node("enc", node).freeze("enc").cache("enc", per="example")
        st.module(g)
        with torch.no_grad():
            assert torch.equal(g.forward(X), node.net(X))
        prints.append(st.TensorCodec().fingerprint(node.net))
    assert prints[0] != prints[1]


def test_one_export_loaded_twice_has_one_fingerprint(user_module, tmp_path):
    """TorchScript mangles a name loaded again (``___torch_mangle_1``): left out."""
    enc = user_module("enc_code", ENCODER.format(pool=MEAN)).Encoder()
    path = tmp_path / "enc.pt"
    torch.jit.save(torch.jit.script(enc), path)
    one, two = torch.jit.load(path), torch.jit.load(path)
    assert st.TensorCodec().fingerprint(one) == st.TensorCodec().fingerprint(two)


def test_the_constants_a_trace_folded_in_enter(user_module):
    """A trace bakes ``self.k`` into its code as a constant (``CONSTANTS.c0``)."""
    mod = user_module("enc_code", ENCODER.format(pool=MEAN))
    torch.manual_seed(0)
    a = mod.Encoder()
    b = mod.Encoder()
    b.load_state_dict(a.state_dict())
    b.k = 5.0
    traced = [torch.jit.trace(m, X) for m in (a, b)]
    assert st.TensorCodec().fingerprint(traced[0]) != st.TensorCodec().fingerprint(traced[1])


def test_a_scripted_modules_attribute_is_read_at_every_key(user_module):
    s = torch.jit.script(user_module("enc_code", ENCODER.format(pool=MEAN)).Encoder())
    codec = st.TensorCodec()
    first = codec.fingerprint(s)
    s.k = 5.0
    assert codec.fingerprint(s) != first
    s.k = 2.0
    assert codec.fingerprint(s) == first


def test_a_scripted_modules_code_is_read_once(user_module, monkeypatch):
    """A frozen backbone's fingerprint is asked every batch: its code is not printed again."""
    s = torch.jit.script(user_module("enc_code", ENCODER.format(pool=MEAN)).Encoder())
    read = []
    real = module_code._script_code
    monkeypatch.setattr(module_code, "_script_code", lambda c: read.append(c) or real(c))
    codec = st.TensorCodec()
    for _ in range(3):
        codec.fingerprint(s)
    assert len(read) == 2  # the encoder and its linear, once each


def test_a_graph_modules_recompiled_code_enters():
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    codec = st.TensorCodec()
    first = codec.fingerprint(gm)
    for n in gm.graph.nodes:
        if n.op == "call_module" and n.target == "1":
            n.target, n.op = torch.tanh, "call_function"
    gm.recompile()
    assert codec.fingerprint(gm) != first


def test_a_script_function_a_node_holds_enters_by_its_code(user_module):
    mod = user_module("fns_code", "import torch\ndef f(x):\n    return x * 2\n")
    one = torch.jit.script(mod.f)
    mod = user_module("fns_code", "import torch\ndef f(x):\n    return x * 3\n")
    other = torch.jit.script(mod.f)
    codecs = default_codecs()
    assert state(Backbone(one), codecs) != state(Backbone(other), codecs)
    assert state(Backbone(one), codecs) == state(Backbone(one), codecs)
