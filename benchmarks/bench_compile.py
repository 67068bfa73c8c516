"""``torch.compile(module(g), fullgraph=True)``: graphs and breaks, and step time against eager.

``torch._dynamo.explain`` counts the graphs and breaks of a four-node graph passing
Opaque tensors (target: one graph, zero breaks). The steady-state training step
(forward, backward, SGD) of the compiled module is timed against the same module
run eagerly, after compilation and warm-up.
"""

from __future__ import annotations

from typing import Any

from common import Row, interleave, per_call

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Dense(Node):
    def __init__(self, i: int, o: int) -> None:
        from torch import nn

        self.lin = nn.Linear(i, o)

    def forward(self, x: Any, ctx: Any) -> Done:
        import torch

        return Done(Opaque(torch.tanh(self.lin(x))))


def run(quick: bool) -> list[Row]:
    import torch
    import torch._dynamo

    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = Graph.somatize(Dense(64, 256) >> Dense(256, 256) >> Dense(256, 256) >> Dense(256, 10))
    model = st.module(g)
    x = torch.randn(64, 64)
    explain = torch._dynamo.explain(model)(x)
    rows = [
        Row(
            "compile",
            "graphs / breaks for 4 Opaque nodes",
            float(explain.graph_count),
            "graphs",
            baseline="graph breaks",
            baseline_value=float(explain.graph_break_count),
            target="1 graph, 0 breaks",
            met=explain.graph_count == 1 and explain.graph_break_count == 0,
        ),
    ]
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(m: Any) -> None:
        opt.zero_grad(set_to_none=True)
        m(x).square().mean().backward()
        opt.step()

    for _ in range(3):  # compile (forward and backward) before timing
        step(compiled)
    number = 50 if quick else 300
    t = interleave(
        {
            "compiled": per_call(lambda: step(compiled), number),
            "eager": per_call(lambda: step(model), number),
        },
        trials=3 if quick else 7,
    )
    rows.append(
        Row(
            "compile",
            "training step, compiled (inductor, CPU)",
            t["compiled"].median * 1e6,
            "µs",
            baseline="eager module(g)",
            baseline_value=t["eager"].median * 1e6,
            ratio=t["compiled"].median / t["eager"].median,
            note="ratio < 1: compiled is faster",
        )
    )
    return rows
