"""Lists of one tensor per example and per-example memory (``somatize/rows.py``).

A tuple or list is read as the fields of one batch, each tensor a row per example. A node
cached per example that returns one tensor per example as a list reads as such fields
too: where the batch has as many rows as each tensor has, nothing is wrong in its shape,
and the rows would be remembered as columns across the examples, then served to other
examples after a shuffle. That form is refused, naming both fixes; the stacked form and
named fields are served as plain PyTorch computes them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import CacheError, Done, Graph, Node

ORDERS = ([0, 1, 2, 3], [4, 5, 6, 7], [3, 2, 1, 0], [4, 0, 5, 1])  # the last two: all hits


class Encoder(Node):
    """A frozen encoder of 8 features an example, returned as ``form`` says: ``"list"``
    (one tensor per example, ``list(h)``), ``"tuple"`` (``h.unbind(0)``), ``"stacked"``
    (the batch tensor) or ``"fields"`` (two named fields of one shape)."""

    def __init__(self, form: str) -> None:
        self.form = form
        self.lin = nn.Linear(5, 8)

    def forward(self, x, ctx):
        h = self.lin(x)
        if self.form == "list":
            return Done(list(h))
        if self.form == "tuple":
            return Done(h.unbind(0))
        if self.form == "fields":
            return Done({"mu": h, "logvar": 2 * h})
        return Done(h)


def frozen(form: str) -> tuple[Graph, nn.Linear]:
    torch.manual_seed(0)
    g = Graph.somatize(Encoder(form).with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    return g, g["enc"].lin


@pytest.mark.parametrize("form", ["list", "tuple"])
def test_one_tensor_per_example_with_as_many_rows_as_the_batch_is_refused(form):
    # 8 examples of 8 features: read as 8 fields of 8 rows, row i would hold feature i of
    # every example (before: stored so, and a shuffled batch was served those columns)
    g, _ = frozen(form)
    x = torch.randn(16, 5)
    with pytest.raises(CacheError) as e:
        g.forward(x[:8])
    message = str(e.value)
    assert f"'enc' is cached per example and returned a {form} of 8 tensors" in message
    assert "torch.stack(" in message and "a dict" in message and "g.cache('enc')" in message
    assert g.keeper is not None and g.keeper.stats().entries == 0  # nothing was stored


def test_other_batch_sizes_are_told_the_row_counts_as_before():
    g, _ = frozen("list")
    with pytest.raises(CacheError, match=r"returned 8 rows for 3 input rows.*torch\.stack"):
        g.forward(torch.randn(3, 5))


@pytest.mark.parametrize("form", ["stacked", "fields"])
def test_the_stacked_and_the_named_forms_are_served_as_plain_torch_computes_them(form):
    g, lin = frozen(form)
    x = torch.randn(8, 5)
    for order in ORDERS:
        got = g.forward(x[order])
        with torch.no_grad():
            h = lin(x[order])
        if form == "fields":
            assert torch.allclose(got["mu"], h, atol=1e-6) and torch.allclose(
                got["logvar"], 2 * h, atol=1e-6
            )
        else:
            assert torch.allclose(got, h, atol=1e-6)
    assert g.keeper is not None and g.keeper.stats().entries == 8


def test_fields_of_one_shape_beside_another_number_of_rows_are_kept_as_fields():
    class Pair(Node):  # (mu, logvar): a tuple of fields, 3 rows each
        def __init__(self) -> None:
            self.lin = nn.Linear(5, 4)

        def forward(self, x, ctx):
            h = self.lin(x)
            return Done((h, 2 * h))

    g = Graph.somatize(Pair().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    x = torch.randn(6, 5)
    g.forward(x[:3])
    mu, logvar = g.forward(x[[2, 1, 0]])  # all hits
    with torch.no_grad():
        h = g["enc"].lin(x[[2, 1, 0]])
    assert torch.allclose(mu, h) and torch.allclose(logvar, 2 * h)
    # a final batch of 2 rows (as many as the fields): fields still, not refused
    mu, logvar = g.forward(x[4:6])
    with torch.no_grad():
        h = g["enc"].lin(x[4:6])
    assert torch.allclose(mu, h) and torch.allclose(logvar, 2 * h)
    assert g.keeper is not None and g.keeper.stats().entries == 5


def test_an_input_of_one_tensor_per_example_stacked_by_the_node_is_told_to_stack_it_before():
    class Stacks(Node):  # after a .mapped() node: a list of one (3,) tensor per example
        def __init__(self) -> None:
            self.lin = nn.Linear(3, 2)

        def forward(self, xs, ctx):
            return Done(self.lin(torch.stack(xs)))

    g = Graph.somatize(Stacks().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    with pytest.raises(CacheError) as e:
        g.forward([torch.randn(3) for _ in range(4)])  # read as 4 fields of 3 rows
    message = str(e.value)
    assert "returned 4 rows for 3 input rows" in message
    assert "a list of 4 tensors, one per example?" in message and "torch.stack" in message
