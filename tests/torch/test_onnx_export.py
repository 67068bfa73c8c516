"""ONNX export of module(g) (docs/deploy.md): what onnxruntime computes from the exported
file equals what module(g) computes, with torch's default exporter (dynamo=True, through
torch.export) and its legacy TorchScript one; a dynamic batch; a cached graph refused with
the fix named."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque

ort = pytest.importorskip("onnxruntime")  # the onnx extra (in dev)
pytest.importorskip("onnxscript")  # what torch's default exporter translates with

# torch 2.13's own export deep-copies a LeafSpec, deprecated in 2.13 (a plain nn.Linear too)
pytestmark = pytest.mark.filterwarnings(
    r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
)


class Encoder(Node):
    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU())

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))  # (batch, 16)


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))  # (batch, 3)


class Join(Node):
    def forward(self, pair, ctx):
        b, c = pair
        return Done(Opaque(torch.cat([b, c], dim=-1)))  # (batch, 6)


def chain() -> Graph:
    return Graph.somatize(Encoder().with_id("enc") >> Head().with_id("head"))


def fork() -> Graph:
    heads = Head().with_id("b") | Head().with_id("c")
    return Graph.somatize(Encoder().with_id("enc") >> heads >> Join().with_id("join"))


def frozen() -> Graph:
    return chain().freeze("enc")


GRAPHS: dict[str, Callable[[], Graph]] = {"chain": chain, "fork": fork, "frozen": frozen}
# float32 through another runtime: the observed difference is about 1e-7 (outputs ~1)
TOL = {"rtol": 1e-5, "atol": 1e-6}


def to_onnx(model: nn.Module, x: torch.Tensor, dynamo: bool, batch: bool = False) -> bytes:
    """The .onnx bytes torch's exporter writes (dynamo=False: the legacy one, deprecated),
    with the batch dimension dynamic where `batch`."""
    f = io.BytesIO()
    if dynamo:
        shapes = (({0: torch.export.Dim("batch")},),) if batch else None  # forward(*args)
        torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=shapes, verbose=False).save(f)
        return f.getvalue()
    axes = {"x": {0: "batch"}, "y": {0: "batch"}} if batch else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(
            model, (x,), f, dynamo=False, input_names=["x"], output_names=["y"], dynamic_axes=axes
        )
    assert any("legacy TorchScript-based ONNX export" in str(w.message) for w in caught)
    return f.getvalue()


def run_onnx(data: bytes, x: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    return torch.from_numpy(out)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_onnxruntime_computes_what_module_g_computes(name, dynamo):
    torch.manual_seed(0)
    g = GRAPHS[name]()
    model = st.module(g).eval()
    x = torch.randn(4, 8)
    out = run_onnx(to_onnx(model, x, dynamo), x)
    with torch.no_grad():
        expected = model(x)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, **TOL)
    if name == "frozen":  # the export left the frozen node frozen
        assert not any(p.requires_grad for p in g["enc"].net.parameters())


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
def test_a_dynamic_batch_runs_other_batch_sizes(dynamo):
    torch.manual_seed(0)
    model = st.module(fork()).eval()
    data = to_onnx(model, torch.randn(4, 8), dynamo, batch=True)
    batch, width = ort.InferenceSession(data).get_inputs()[0].shape
    assert isinstance(batch, str) and width == 8  # a named dimension, not 4
    for n in (1, 7):
        x = torch.randn(n, 8)
        with torch.no_grad():
            torch.testing.assert_close(run_onnx(data, x), model(x), **TOL)
    static = to_onnx(model, torch.randn(4, 8), dynamo)  # the control: batch 4 only
    assert ort.InferenceSession(static).get_inputs()[0].shape == [4, 8]
    with pytest.raises(Exception, match=r"invalid dimensions.*\n.*Got: 7 Expected: 4"):
        run_onnx(static, torch.randn(7, 8))


def test_a_cached_graph_is_refused_naming_the_fix_and_exports_with_caching_off():
    g = Graph.somatize(Encoder().with_id("enc") >> Head().with_id("head"), keeper=MemoryKeeper())
    g.freeze("enc").cache("enc", per="example")
    model = st.module(g).eval()
    x = torch.randn(4, 8)
    fix = r"caches 'enc'.*an export.*g\.cache\('enc', False\)"
    # torch's default exporter wraps what torch.export raised, and chains it
    with pytest.raises(torch.onnx.OnnxExporterError, match=fix) as refused:
        to_onnx(model, x, dynamo=True)
    assert isinstance(refused.value.__cause__, TypeError)
    with pytest.raises(TypeError, match=fix):
        to_onnx(model, x, dynamo=False)
    g.cache("enc", False)
    out = run_onnx(to_onnx(model, x, dynamo=True), x)
    with torch.no_grad():
        torch.testing.assert_close(out, g["head"].out(g["enc"].net(x)), **TOL)
