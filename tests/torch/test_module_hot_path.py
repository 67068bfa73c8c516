"""``module(g)``'s hot path: called again at the same step and mode (evaluation, inference,
a plain PyTorch loop), each node gets the ``Ctx`` it got the call before — made once, not
on every call — and a new one as soon as the step, the mode or the graph's run id moves."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch

import somatize.hot_path as hot_path
import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

from .tensor_nodes import Linear


class Seen(Node):
    """A linear layer that keeps every ``Ctx`` it is called with."""

    def __init__(self) -> None:
        self.lin = torch.nn.Linear(2, 2)
        self.seen: list[Any] = []

    def forward(self, x: Any, ctx: Any) -> Done:
        self.seen.append(ctx)
        return Done(Opaque(self.lin(x)))


def test_calls_at_one_step_and_mode_make_each_nodes_ctx_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[int] = []
    real = hot_path._new_ctx

    def counting(cls: Any, fields: Any) -> Any:
        made.append(1)
        return real(cls, fields)

    monkeypatch.setattr(hot_path, "_new_ctx", counting)
    a, b = Seen(), Seen()
    m = st.module(Graph.somatize(a >> b))
    x = torch.ones(1, 2)
    for _ in range(10):
        m(x)
    assert len(made) == 4  # the first call, as it goes; the second binds them for the rest
    assert len({id(c) for c in a.seen}) == 2 and a.seen[-1] is a.seen[1]
    assert (a.seen[-1].node, a.seen[-1].step, a.seen[-1].training) == ("seen", 0, True)
    m.step = 7
    m(x)
    assert (b.seen[-1].node, b.seen[-1].step, b.seen[-1].training) == ("seen_2", 7, True)
    m.eval()
    m(x)
    assert (b.seen[-1].step, b.seen[-1].training) == (7, False)
    m.graph.run_id = "another"
    m(x)
    assert b.seen[-1].run_id == "another"
    m.step = 8
    m.train()
    with torch.no_grad():
        m(x)
    assert (a.seen[-1].step, a.seen[-1].training) == (8, True)


def test_a_model_called_is_copied_and_pickled_as_before() -> None:
    """What the hot path keeps between calls (the last ``Run``, the bound steps, both
    holding a mapping proxy) is left out of a copy and a pickle, and made again there."""
    m = st.module(Graph.somatize(Linear(2, 2) >> Linear(2, 2)))
    x = torch.ones(1, 2)
    m(x)
    m(x)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(other(x), m(x))
        torch.testing.assert_close(other(x), m(x))
