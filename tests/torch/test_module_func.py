"""``torch.func`` over ``module(g)`` when a node holds a bare ``nn.Parameter`` or tensor as
its own attribute (not inside a module): ``functional_call`` swaps what the node's
forward reads, so ``vmap(grad(...))`` gives the per-sample gradients plain PyTorch gives;
copies and moves keep the node reading its module's tensors."""

from __future__ import annotations

import copy
import pickle

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Affine(Node):
    """y = x * scale + shift, from a bare parameter and a bare (buffer) tensor."""

    def __init__(self) -> None:
        self.scale = nn.Parameter(torch.randn(4))
        self.shift = torch.randn(4)

    def forward(self, x, ctx):
        return Done(Opaque(x * self.scale + self.shift))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def _graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Affine().with_id("aff") >> Head().with_id("head"))


def _plain(p: dict[str, torch.Tensor], shift: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The same model written by hand over the parameters ``p``."""
    h = x * p["aff.scale"] + shift
    return nn.functional.linear(h, p["head.lin.weight"], p["head.lin.bias"])


def test_functional_call_swaps_a_bare_parameter_and_buffer_and_puts_them_back():
    g = _graph()
    model, node = st.module(g), g["aff"]
    scale, shift = node.scale, node.shift
    given = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    other_shift = torch.randn(4)
    x = torch.randn(5, 4)
    out = functional_call(model, {**given, "aff.shift": other_shift}, (x,))
    assert_close(out, _plain(given, other_shift, x))
    assert node.scale is scale and node.shift is shift  # restored after the call
    assert model.get_parameter("aff.scale") is scale
    assert_close(model(x), _plain(dict(model.named_parameters()), shift, x))


def test_per_sample_gradients_of_a_bare_parameter_match_plain_pytorch():
    g = _graph()
    model, shift = st.module(g), g["aff"].shift
    params = {name: p.detach() for name, p in model.named_parameters()}
    x, y = torch.randn(6, 4), torch.tensor([0, 2, 1, 0, 1, 2])

    def loss(p, xi, yi):
        return nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    def plain_loss(p, xi, yi):
        return nn.functional.cross_entropy(_plain(p, shift, xi[None]), yi[None])

    ours = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    want = vmap(grad(plain_loss), in_dims=(None, 0, 0))(params, x, y)
    assert set(ours) == set(params)
    for name in params:
        assert_close(ours[name], want[name], msg=name)
    assert ours["aff.scale"].abs().sum() > 0  # the swapped parameter was the one used
    for i in range(len(x)):  # and each row is that example's own gradient
        loose = {k: v.clone().requires_grad_() for k, v in params.items()}
        plain_loss(loose, x[i], y[i]).backward()
        assert_close(ours["aff.scale"][i], loose["aff.scale"].grad)


def test_a_deep_copy_or_a_pickle_reads_its_own_tensors():
    g = _graph()
    model = st.module(g)
    x = torch.randn(2, 4)
    want = model(x).detach()
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        node = twin.graph["aff"]
        assert node.scale is twin.get_parameter("aff.scale")
        assert node.shift is twin.get_buffer("aff.shift")
        assert node.scale is not g["aff"].scale
        assert_close(twin(x), want)
        with torch.no_grad():
            twin.get_parameter("aff.scale").mul_(2)
        assert_close(model(x), want)  # the original is untouched
        assert_close(functional_call(twin, {"aff.shift": torch.zeros(4)}, (x,)).shape, want.shape)
        assert node.shift is twin.get_buffer("aff.shift")


def test_a_move_that_makes_new_parameters_reaches_the_node():
    g = _graph()
    model, node = st.module(g), g["aff"]
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert node.scale is model.get_parameter("aff.scale")
    assert node.scale.dtype == torch.float64 and node.shift.dtype == torch.float64
    assert node.shift is model.get_buffer("aff.shift")
    assert model(torch.randn(2, 4, dtype=torch.float64)).dtype == torch.float64


def test_an_ensemble_runs_under_vmap_with_stacked_bare_parameters():
    # torch's model-ensembling recipe: stacked state, a copy on the meta device, vmap
    from torch.func import stack_module_state

    models = [st.module(_graph()) for _ in range(3)]
    for i, m in enumerate(models):  # (three different models)
        with torch.no_grad():
            m.get_parameter("aff.scale").add_(i)
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    x = torch.randn(5, 4)

    def one(p, b, x):
        return functional_call(base, (p, b), (x,))

    out = vmap(one, in_dims=(0, 0, None))(params, buffers, x)
    assert_close(out, torch.stack([m(x) for m in models]).detach())
