"""Why a value is not data (``somatize/value_reasons.py``): each refusal names its fix. The
engine imports no torch, so a tensor is stood in for by a class torch would own."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Ctx, Done, Graph, Node, Opaque, ValueConversionError


class Tensor:  # a stand-in, known as torch's by its module
    __module__ = "torch"

    def __init__(self, requires_grad: bool) -> None:
        self.requires_grad = requires_grad


class Same(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


class Keep(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(Opaque(x))


def test_a_tensor_that_requires_grad_is_told_to_go_opaque_not_to_get_codecs() -> None:
    g = Graph.somatize(Keep())
    with pytest.raises(ValueConversionError) as info:
        g.forward(Tensor(requires_grad=True))
    said = str(info.value)
    assert said.startswith("the graph input: cannot pass a torch.Tensor that requires grad")
    assert "wrap it in Opaque(...)" in said and "model = st.module(g); model(x)" in said
    assert ".detach()" in said and "codecs" not in said  # (codecs would refuse it too)
    kept = Tensor(requires_grad=True)
    assert g.forward(Opaque(kept)) is kept  # what it says to write runs
    out = r"the output of node 'same': cannot pass a torch\.Tensor that requires grad: .*Opaque"
    with pytest.raises(ValueConversionError, match=out):  # (a node's output is told the same)
        Graph.somatize(Same()).forward(Opaque(kept))


def test_a_tensor_without_grad_is_told_the_codecs_come_with_st_module() -> None:
    with pytest.raises(ValueConversionError, match=r"data only with the codecs of somatize\.torch"):
        Graph.somatize(Same()).forward(Tensor(requires_grad=False))
