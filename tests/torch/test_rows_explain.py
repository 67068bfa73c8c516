"""Per-example memory and explain: a change of weights, declaration, code or helper misses
and explain says which; a new input row is named as the input."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import somatize.torch as st
from somatize import Graph, MemoryKeeper
from tests.torch.rows_graphs import Encoder, Head, data, graph


def test_a_change_of_weights_or_declaration_misses_and_explain_says_which():
    keeper = MemoryKeeper()
    g = graph(keeper=keeper)
    m = st.module(g)
    x = data().tensors[0][:8]
    m(x)
    assert str(g.explain(x)) == "enc: hit (8 of 8 examples hit)"
    with torch.no_grad():
        g["enc"].net[0].weight.mul_(2)
    why = g.explain(x)["enc"]
    assert not why.hit and why.rows == (0, 8)
    assert why.changed == ("state (weights or held data)",)

    torch.manual_seed(0)  # the same weights, another declaration
    g2 = Graph.somatize(Encoder(scale=2.0).with_id("enc") >> Head().with_id("head"), keeper=keeper)
    g2.freeze("enc").cache("enc", per="example")
    st.module(g2)
    # scale is an argument and a plain attribute: declaration and state both change
    assert g2.explain(x)["enc"].changed == (
        "declaration (constructor arguments)",
        "state (weights or held data)",
    )
    m(x[:4])  # explain wrote nothing: the changed encoder still misses
    assert g.explain(x[:4])["enc"].hit


def test_a_change_of_code_or_of_a_helper_misses_and_explain_names_it(user_module):
    source = """
        import torch
        from torch import nn
        from somatize import Done, Node, Opaque

        def act(h):
            return torch.relu(h)  # HELPER

        class Enc(Node):
            def __init__(self):
                self.lin = nn.Linear(4, 4)

            def forward(self, x, ctx):
                return Done(Opaque(act(self.lin(x)) + 0))  # CODE
    """
    mod = user_module("rowcode", source)
    keeper = MemoryKeeper()

    def make():
        torch.manual_seed(0)
        g = Graph(keeper=keeper).node("enc", mod.Enc()).freeze("enc")
        g.cache("enc", per="example")
        st.module(g)
        return g

    x = torch.randn(5, 4)
    make().forward(x)
    assert make().explain(x)["enc"].hit
    mod = user_module("rowcode", source.replace("# HELPER", "# a comment changes nothing"))
    assert make().explain(x)["enc"].hit
    mod = user_module("rowcode", source.replace("torch.relu(h)", "torch.tanh(h)"))
    why = make().explain(x)["enc"]
    assert not why.hit and why.changed == ("code of rowcode.act",)
    mod = user_module("rowcode", source.replace("+ 0", "+ 1"))
    why = make().explain(x)["enc"]
    assert not why.hit and why.changed == ("code of rowcode.Enc",)


def test_a_new_input_row_is_named_as_the_input():
    g = graph()
    st.module(g)(data().tensors[0][:4])
    why = g.explain(data().tensors[0][2:6])["enc"]
    assert why.rows == (2, 2) and why.changed == ("input: 2 examples not seen before",)


@pytest.mark.parametrize("spread", [False, True])
def test_explain_given_a_dataloader_batch_whole_says_to_pass_the_inputs(spread: bool) -> None:
    g = graph()
    st.module(g)
    batch = next(iter(DataLoader(data(), batch_size=4)))  # a list [inputs, targets]
    with pytest.raises((AttributeError, TypeError)) as caught:  # (a list has no .shape)
        g.explain(*batch) if spread else g.explain(batch)
    notes = getattr(caught.value, "__notes__", [])
    assert any(
        "a DataLoader batch (inputs, targets), give the graph its inputs alone, batch[0]" in n
        for n in notes
    )
    assert g.explain(batch[0])["enc"].rows == (0, 4)  # the inputs alone: explained


def test_explain_adds_no_batch_note_to_an_error_on_one_tensor() -> None:
    g = graph()
    st.module(g)
    with pytest.raises(RuntimeError) as caught:  # a wrong width: torch's own error
        g.explain(torch.randn(4, 5))
    assert not any("DataLoader" in n for n in getattr(caught.value, "__notes__", []))
