"""torch.compile under the Trainer: nodes see each step, zero recompiles after warm-up, and
every run of a sweep in one process compiled."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.watchers import Metrics, StepEnd

EAGER = {"backend": "eager", "fullgraph": True}  # dynamo's guards and recompiles, no codegen


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 2)

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(Opaque(out), metrics={"step": ctx.step})


class Graphs:
    """After every step: dynamo's count of compiled graphs, and the step nodes saw."""

    def __init__(self) -> None:
        self.graphs: list[int] = []
        self.seen: list[int] = []

    def on_event(self, event) -> None:
        if isinstance(event, StepEnd):
            self.graphs.append(counters["stats"]["unique_graphs"])
        elif isinstance(event, Metrics) and event.node == "linear":
            self.seen.append(int(event.values["step"]))


def fit(model, **options):
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(12)]
    watch = Graphs()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[watch],
        seed=0,  # (the sweep below varies the initial weights only, on purpose)
        options=st.Options(progress=False, shuffle=False, **options),
    ).fit(model, data)
    return watch


def fresh():
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    return Graph.somatize(Linear())


@pytest.mark.parametrize("how", ["option", "in place", "wrapper"])
def test_zero_recompiles_after_warm_up_and_nodes_see_every_step(how):
    g = fresh()
    if how == "option":
        watch = fit(g, compile=EAGER)
    elif how == "in place":
        m = st.module(g)
        m.compile(**EAGER)
        watch = fit(m)
    else:
        watch = fit(torch.compile(st.module(g), **EAGER))
    assert watch.seen == list(range(1, 13))  # ctx.step, as without compile
    # the first step compiles, the second once more with the step dynamic; then nothing
    assert watch.graphs[1] == watch.graphs[-1] <= 2
    assert watch.graphs[0] >= 1


@pytest.mark.parametrize("how", ["option", "in place", "wrapper"])
def test_a_compiled_fit_without_watchers_has_its_node_metrics_epoch_mean(how):
    """The fast path reads the metrics the compiled forward wrote: ctx.step 1 to 12, each
    of a batch of 8, is 6.5 an epoch (compiling twice: the step is dynamic from the 2nd)."""
    g = fresh()
    m = st.module(g)
    if how == "in place":
        m.compile(**EAGER)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(12)]
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False, compile=EAGER if how == "option" else False),
    ).fit(torch.compile(m, **EAGER) if how == "wrapper" else m, data)
    assert result.epoch_metrics == {"linear/step": [6.5]}


def test_the_compiled_run_equals_the_eager_one():
    g = fresh()
    fit(g, compile=EAGER)
    compiled = st.state(g)
    g = fresh()
    fit(g)
    for k, v in st.state(g).items():
        torch.testing.assert_close(compiled[k], v)


def test_bad_compile_is_refused():
    with pytest.raises(TypeError, match="compile must be True, False or torch.compile's keyword"):
        st.Options(compile="yes")


@pytest.mark.parametrize("how", ["option", "wrapper"])
def test_every_run_of_a_sweep_in_one_process_is_compiled(how):
    # before: the graphs shared GraphModule.forward's code object, and so dynamo's limit of
    # 8 recompiles: from the ninth run on, the sweep ran eagerly, said only in a log line
    torch._dynamo.reset()
    counters.clear()
    runs = torch._dynamo.config.recompile_limit + 2
    for seed in range(runs):
        torch.manual_seed(seed)
        g = Graph.somatize(Linear())
        before = counters["stats"]["unique_graphs"]
        if how == "option":
            watch = fit(g, compile=EAGER)
        else:
            watch = fit(torch.compile(st.module(g), **EAGER))
        assert watch.graphs[0] > before, f"run {seed} was not compiled"
    assert not counters["recompile_limit"]


class Scaled(Node):
    """Computes with the step: a graph that reads ``ctx.step`` as a number, not a constant."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x) / (1.0 + ctx.step)), metrics={"step": ctx.step})


@pytest.mark.parametrize("dynamic", [None, False])
def test_the_step_compiles_once_even_with_dynamic_false(dynamic):
    # before: dynamic=False specialised the step, one recompile a step until dynamo's limit
    # (8); the rest of the run then went eager, said only in a log line
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    g = Graph.somatize(Scaled().with_id("linear"))
    watch = fit(g, compile={**EAGER, "dynamic": dynamic})
    assert watch.graphs == [1] * 12  # one trace; no step after the first compiled again
    assert not counters["recompile_limit"]
    compiled = st.state(g)
    torch.manual_seed(0)
    g = Graph.somatize(Scaled().with_id("linear"))
    fit(g)
    for k, v in st.state(g).items():
        torch.testing.assert_close(compiled[k], v)
