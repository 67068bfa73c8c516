"""A frozen node holding a torch.export'ed module (``ExportedProgram.module()``): torch
refuses its ``train``/``eval`` (its mode was fixed when it was exported), so freezing it
is a ``NodeError`` naming the node, the module and the fix, never torch's bare
``NotImplementedError``; and the fix the message gives works."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, NodeError, Opaque


class Backbone(Node):
    def __init__(self, net: nn.Module | list[nn.Module]) -> None:
        self.net = net

    def forward(self, x, ctx):
        net = self.net[0] if isinstance(self.net, list) else self.net
        return Done(Opaque(net(x)))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 1)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class FixedMode(nn.Module):
    """The fix the error gives: holds an exported module, and its train(mode) sets only
    its own flag (the exported module's mode was fixed when it was exported)."""

    def __init__(self, exported: nn.Module) -> None:
        super().__init__()
        self.exported = exported

    def train(self, mode: bool = True) -> FixedMode:
        self.training = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.exported(x)  # type: ignore[no-any-return]


def exported(model: nn.Module) -> nn.Module:
    return torch.export.export(model, (torch.zeros(2, 4),)).module()


FIX = r"Freeze the nn\.Module it was made from.*torch\.export\.export\(model\.eval\(\), args\)"


def test_freezing_an_exported_module_is_an_error_naming_the_node_and_the_fix() -> None:
    g = Graph.somatize(Backbone(exported(nn.Linear(4, 3))) >> Head()).freeze("backbone")
    said = rf"node 'backbone' is frozen.*'net' is a module made by torch\.export.*{FIX}"
    with pytest.raises(NodeError, match=said) as caught:
        st.module(g)
    assert isinstance(caught.value.__cause__, NotImplementedError)  # torch's, chained


def test_a_freeze_after_module_g_is_refused_at_the_next_call_and_forward() -> None:
    g = Graph.somatize(Backbone([exported(nn.Linear(4, 3))]) >> Head())
    m = st.module(g)  # (unfrozen: nothing asks it to change its mode)
    m(torch.ones(2, 4))
    g.freeze("backbone")
    with pytest.raises(NodeError, match=r"node 'backbone' is frozen.*'net\.0' is a module made"):
        m(torch.ones(2, 4))
    with pytest.raises(NodeError, match=r"node 'backbone' is frozen.*'net\.0'"):
        g.forward(torch.ones(2, 4))  # (the frozen runtime, at the node's call)


def test_the_fix_the_error_gives_freezes_an_exported_module_like_plain_torch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))
    head = Head()
    g = Graph.somatize(Backbone(FixedMode(exported(model.eval()))) >> head).freeze("backbone")
    m = st.module(g)
    m.train()
    x = torch.randn(2, 4)
    out = m(x)
    assert_close(out, head.lin(model(x)))  # the dropout off, as exported
    out.sum().backward()
    assert head.lin.weight.grad is not None
    frozen = [p for name, p in m.named_parameters() if name.startswith("backbone.")]
    assert frozen and not any(p.requires_grad or p.grad is not None for p in frozen)


def test_an_unfrozen_exported_module_refusing_train_names_the_node_and_the_fix() -> None:
    g = Graph.somatize(Backbone(exported(nn.Linear(4, 3))) >> Head())
    m = st.module(g)
    for call, said in ((m.train, r"train\(\)"), (m.eval, r"eval\(\)")):
        with pytest.raises(NodeError, match=rf"module\(g\)\.{said} reaches node 'backbone'") as e:
            call()
        assert "'net' in it is a module made by torch.export" in str(e.value)
        assert "whose train(mode) sets only its own self.training" in str(e.value)
        assert isinstance(e.value.__cause__, NotImplementedError)  # torch's, chained
    fit = st.Trainer(loss=nn.functional.mse_loss, optimizer=lambda p: torch.optim.SGD(p, 0.1))
    with pytest.raises(NodeError, match=r"reaches node 'backbone'"):
        fit.fit(g, [(torch.ones(2, 4), torch.ones(2, 1))])


def test_the_wrapper_the_error_gives_trains_an_exported_module_like_plain_torch() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    head = Head()
    ours = Graph.somatize(Backbone(FixedMode(exported(model))) >> head)
    plain_model, plain_head = nn.Linear(4, 3), nn.Linear(3, 1)
    plain_model.load_state_dict(model.state_dict())
    plain_head.load_state_dict(head.lin.state_dict())
    x, y = torch.randn(2, 4), torch.randn(2, 1)  # (exported for a batch of 2)
    st.Trainer(
        loss=nn.functional.mse_loss, optimizer=lambda p: torch.optim.SGD(p, 0.1), epochs=1
    ).fit(ours, [(x, y)])
    opt = torch.optim.SGD([*plain_model.parameters(), *plain_head.parameters()], 0.1)
    nn.functional.mse_loss(plain_head(plain_model(x)), y).backward()
    opt.step()
    assert_close(head.lin.weight, plain_head.weight)
    exported_weight = dict(ours["backbone"].net.exported.named_parameters())["weight"]
    assert_close(exported_weight, plain_model.weight)
