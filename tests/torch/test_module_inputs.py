"""What ``module(g)``'s forward takes: tensors as Opaque, and a batch (a tuple, list or
dict) holding a tensor that requires grad as Opaque too, so input gradients flow as
through a plain ``nn.Module``; deeper, the graph input's error says to wrap it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from somatize import Done, Graph, Node, Opaque, ValueConversionError
from somatize.torch import module


def test_a_batch_holding_a_tensor_that_requires_grad_runs_as_with_a_plain_module():
    """Input gradients of a multimodal batch: model({"img": x}) as nn.Module code writes it."""

    class Img(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(3, 2)

        def forward(self, batch, ctx):
            return Done(Opaque(self.lin(batch["img"])))

    g = Graph.somatize(Img())
    img = torch.randn(4, 3, requires_grad=True)
    module(g)({"img": img}).sum().backward()
    want = torch.autograd.grad(g["img"].lin(img).sum(), img)[0]
    assert torch.equal(img.grad, want)
    for call in (lambda: module(g)({"a": {"img": img}}), lambda: g.forward({"img": img})):
        with pytest.raises(ValueConversionError) as e:  # deeper, or the graph's own forward
            call()
        msg = str(e.value)
        assert msg.startswith("the graph input at [") and "requires grad" in msg
        assert "model(Opaque(batch))" in msg and "g.forward(Opaque(batch))" in msg
        assert "freeze" not in msg and "node's output" not in msg
