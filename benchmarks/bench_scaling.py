"""Scaling: chains and forks of 10, 100, 1,000 and 10,000 nodes, each against a baseline.

For each shape and size, in the same run and interleaved:

* **build** — writing the expression (``a >> b >> ...``; ``src >> (b1 | b2 | ...) >> join``)
  and ``Graph.somatize`` over node instances made beforehand, against ``nn.Sequential``
  over as many modules made beforehand;
* **first forward** — the first ``g.forward`` of a fresh graph (it compiles the plan),
  against the first call of the same walk written as plain Python functions;
* **forward** — a steady ``g.forward`` (identity nodes, Opaque), against the plain walk;
  the per-node cost is the time over the node count;
* **module(g)** — ``somatize.torch.module(g)`` over nodes that each hold an
  ``nn.Linear(4, 4)``, against ``nn.Sequential`` over the same number of ``nn.Linear``.
  Beside them, the floor of any design that keeps the parameter names (``node.lin.weight``):
  one ``nn.Module`` per node, made as ``module(g)`` makes it (``somatize.torch.blank``, lazy),
  holding its ``nn.Linear``, in a dict by node id — timed apart at 1,000 nodes, after the
  grids (its garbage would move them), and reported in the module(g) rows' note.
  ``module(g)`` registers the modules; the plan is compiled by the module's first forward,
  which the end-to-end row (a 1,000-layer model made and run once) counts.

The growth factor per 10× (time at 10 N over time at N) is ~10 for linear cost; the
target ≤ 12× makes super-linear growth visible. A size is skipped (and said so) when
the one before it took over a second to build: quadratic code would take minutes.
Also: the forward of a 100-branch fork of ``nn.Linear`` nodes joined, through
``module(g)``, against the same network as a plain ``nn.Module``.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable
from typing import Any

from common import Row, Sample, Timing, cpu_ratio, fmt, interleave, per_call
from scaling_graphs import Lin, expression, make_nodes, plain_walk

from somatize import Done, Graph, Node, Opaque

SIZES = (10, 100, 1_000, 10_000)
GROWTH_TARGET = 12.0
#: the tables of the last run, by shape, for docs/benchmarks.md (run.py writes them)
TABLES: dict[str, str] = {}


def fresh(make: Callable[[], Any], run: Callable[[Any], Any], count: int) -> Callable[[], float]:
    """A candidate timing ``run`` once on each of ``count`` objects made (untimed) before."""

    def candidate() -> float:
        objs = [make() for _ in range(count)]
        gc.collect()
        cpu, start = time.process_time(), time.perf_counter()
        for o in objs:
            run(o)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return Sample(wall / count, cpu / count)

    return candidate


def floor(linears: list[Any], held_class: type) -> dict[str, Any]:
    """What ``module(g)`` cannot do without: a module per node (the node-id level of the
    names), made as it makes them (``blank`` of a ``lazy`` class), holding the node's
    ``nn.Linear``."""
    from somatize.torch.blank import blank

    top: dict[str, Any] = {}
    for i, lin in enumerate(linears):
        held = blank(held_class)
        held._modules["lin"] = lin
        top[f"lin_{i}"] = held
    return top


def floor_ratio(n: int, quick: bool) -> tuple[float, float]:
    """CPU time of ``floor`` over N ``nn.Linear`` and its ratio to ``nn.Sequential`` of them,
    interleaved in a run of their own, after the grids (its garbage, 10,000 modules at the
    largest size, would move what is timed after it there)."""
    from torch import nn

    from somatize.torch.blank import lazy

    @lazy
    class Held(nn.Module):
        pass

    linears = [nn.Linear(4, 4) for _ in range(n)]
    t = interleave(
        {
            "floor": per_call(lambda: floor(linears, Held), 1),
            "base": per_call(lambda: nn.Sequential(*linears), 1),
        },
        trials=5 if quick else 9,
    )
    return cpu(t["floor"]), cpu(t["floor"]) / cpu(t["base"])


def candidates(shape: str, n: int, quick: bool) -> dict[str, Callable[[], float]]:
    """The timed candidates of one shape and size: each measure and its baseline."""
    import torch
    from torch import nn

    import somatize.torch as st

    x = Opaque(torch.zeros(1))
    reps = max(1, (200 if quick else 2_000) // n)
    nodes = make_nodes(shape, n)
    idents = [nn.Identity() for _ in range(n)]
    linears = [nn.Linear(4, 4) for _ in range(n)]
    g = Graph.somatize(expression(shape, nodes))
    plain = plain_walk(shape, n)
    assert g.forward(x) is x.value and plain(x.value) is x.value

    def fresh_graph() -> Graph:
        return Graph.somatize(expression(shape, make_nodes(shape, n)))

    def fresh_lin_graph() -> Graph:
        return Graph.somatize(expression(shape, make_nodes(shape, n, Lin)), codecs=())

    return {
        f"build {n}": per_call(lambda: Graph.somatize(expression(shape, nodes)), reps),
        f"build base {n}": per_call(lambda: nn.Sequential(*idents), reps),
        f"first {n}": fresh(fresh_graph, lambda h: h.forward(x), reps),
        f"first base {n}": fresh(lambda: plain_walk(shape, n), lambda f: f(x.value), reps),
        f"forward {n}": per_call(lambda: g.forward(x), reps * 5),
        f"forward base {n}": per_call(lambda: plain(x.value), reps * 5),
        f"module {n}": fresh(fresh_lin_graph, st.module, max(1, reps // 4)),
        f"module base {n}": per_call(lambda: nn.Sequential(*linears), reps),
    }


def measure(
    shape: str, sizes: tuple[int, ...], quick: bool
) -> tuple[dict[int, dict[str, tuple[Timing, Timing]]], str]:
    """Every size of one shape, interleaved (so a change in load hits every size alike).

    A size is left out, and said so, when one untimed build of the size before it took
    over a second (quadratic code would take minutes at the next)."""
    kept: list[int] = []
    skipped = ""
    took = 0.0
    for n in sizes:
        if took > 1.0:
            skipped = f" — {n:,} nodes and more skipped: {kept[-1]:,} took over 1 s to build"
            break
        nodes = make_nodes(shape, n)
        start = time.perf_counter()
        Graph.somatize(expression(shape, nodes))
        took = time.perf_counter() - start
        kept.append(n)
    todo: dict[str, Callable[[], float]] = {}
    for n in kept:
        todo.update(candidates(shape, n, quick))
    t = interleave(todo, trials=3 if quick else 5)
    got = {n: {m: (t[f"{m} {n}"], t[f"{m} base {n}"]) for m in MEASURES} for n in kept}
    return got, skipped


MEASURES = {
    "build": ("build", "nn.Sequential of N modules"),
    "first": ("first forward", "plain Python walk, first call"),
    "forward": ("forward", "plain Python walk"),
    "module": ("module(g), N nn.Linear nodes", "nn.Sequential of N nn.Linear"),
}


def cpu(t: Timing) -> float:
    """The median CPU time where it was read (less moved by other processes), else wall."""
    return t.cpu.median if t.cpu is not None else t.median


def growth(values: list[float]) -> list[float]:
    return [b / a for a, b in itertools.pairwise(values) if a > 0]


def table(shape: str, got: dict[int, dict[str, tuple[Timing, Timing]]], skipped: str) -> str:
    sizes = sorted(got)
    head = " | ".join(f"{n:,}" for n in sizes)
    lines = [
        f"**{shape}** (median wall time; ratio to the baseline in brackets){skipped}",
        "",
        f"| measure | {head} | growth per 10× (CPU time) | target |",
        "|---|" + "---|" * len(sizes) + "---|---|",
    ]
    for m, (label, base) in MEASURES.items():
        cells = []
        for n in sizes:
            ours, ref = got[n][m]
            cells.append(f"{fmt(ours.median * 1e6, 'µs')} ({ours.median / ref.median:.2f}×)")
        g = growth([cpu(got[n][m][0]) for n in sizes])
        met = "yes" if g and max(g) <= GROWTH_TARGET else "**MISSED**"
        lines.append(
            f"| {label} vs {base} | {' | '.join(cells)} | "
            f"{', '.join(f'{v:.1f}×' for v in g)} | ≤ {GROWTH_TARGET:.0f}× {met} |"
        )
    per_node = [f"{got[n]['forward'][0].median / n * 1e6:.2f} µs" for n in sizes]
    lines.append(f"| forward per node | {' | '.join(per_node)} | | |")
    return "\n".join(lines)


def fork_forward(quick: bool) -> Row:
    """A 100-branch fork of nn.Linear nodes, joined: module(g) against a plain nn.Module."""
    import torch
    from torch import nn

    import somatize.torch as st

    torch.set_num_threads(1)

    class Sum(Node):
        def forward(self, xs: Any, ctx: Any) -> Done:
            return Done(Opaque(torch.stack(xs).sum(0)))

    src, branches, join = Lin(), [Lin() for _ in range(100)], Sum()
    m = st.module(Graph.somatize(expression("fork", [src, *branches, join])))

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.src = src.lin
            self.branches = nn.ModuleList([b.lin for b in branches])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.src(x)
            return torch.stack([b(h) for b in self.branches]).sum(0)

    forwards = [b.forward for b in branches]

    def nodes_by_hand(x: torch.Tensor) -> Any:
        """The nodes' own cost (their forward, Done and Opaque), walked by hand: what is left
        over plain for any engine that keeps the node contract."""
        h = src.forward(x, None)[0].value
        return join.forward(tuple([f(h, None)[0].value for f in forwards]), None)[0].value

    plain = Plain()
    x = torch.randn(8, 4)
    torch.testing.assert_close(m(x), plain(x))
    torch.testing.assert_close(nodes_by_hand(x), plain(x))
    number = 50 if quick else 300
    t = interleave(
        {
            "somatize": per_call(lambda: m(x), number),
            "plain": per_call(lambda: plain(x), number),
            "by hand": per_call(lambda: nodes_by_hand(x), number),
        },
        trials=5 if quick else 9,
    )
    ours, ref, hand = t["somatize"], t["plain"], t["by hand"]
    ratio = ours.median / ref.median
    return Row(
        "scaling",
        "forward of a 100-branch fork joined (nn.Linear nodes), module(g)",
        ours.median * 1e6,
        "µs",
        baseline="the same as a plain nn.Module",
        baseline_value=ref.median * 1e6,
        ratio=ratio,
        cpu_ratio=cpu_ratio(ours, ref),
        target="≤ 1.1× plain",
        met=ratio <= 1.1,
        spread=f"{fmt(ours.min * 1e6, 'µs')} – {fmt(ours.max * 1e6, 'µs')}",
        note=f"{(ours.median - ref.median) / 102 * 1e6:.2f} µs per node over plain, of which "
        f"the nodes' own forward, Done and Opaque (walked by hand: {hand.median / ref.median:.2f}× "
        f"plain) {(hand.median - ref.median) / 102 * 1e6:.2f} µs",
    )


def model_end_to_end(quick: bool) -> Row:
    """A 1,000-layer model made from nothing and run once: nodes holding nn.Linear, the graph,
    module(g) and its first forward (which compiles the plan); against the layers,
    nn.Sequential and its first forward."""
    import torch
    from torch import nn

    import somatize.torch as st

    n = 1_000
    x = torch.zeros(1, 4)

    def ours() -> Any:
        return st.module(Graph.somatize(expression("chain", make_nodes("chain", n, Lin))))(x)

    def base() -> Any:
        return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])(x)

    t = interleave(
        {"somatize": per_call(ours, 1), "base": per_call(base, 1)}, trials=3 if quick else 7
    )
    a, b = t["somatize"], t["base"]
    ratio = a.median / b.median
    return Row(
        "scaling",
        "a 1,000-layer model end to end: Linear nodes + Graph.somatize + module(g) + its "
        "first forward",
        a.median * 1e3,
        "ms",
        baseline="nn.Linear layers + nn.Sequential + its first forward",
        baseline_value=b.median * 1e3,
        ratio=ratio,
        cpu_ratio=cpu_ratio(a, b),
        target="≤ 1.5×",
        met=ratio <= 1.5,
        spread=f"{fmt(a.min * 1e3, 'ms')} – {fmt(a.max * 1e3, 'ms')}",
    )


def run(quick: bool) -> list[Row]:
    import torch

    torch.set_num_threads(1)
    sizes = SIZES[:3] if quick else SIZES
    rows: list[Row] = []
    grids = {shape: measure(shape, sizes, quick) for shape in ("chain", "fork")}
    floor = floor_ratio(1_000, quick)
    for shape, (got, skipped) in grids.items():
        TABLES[shape] = table(shape, got, skipped)
        print(TABLES[shape], flush=True)
        for m, (label, _) in MEASURES.items():
            values = [cpu(got[n][m][0]) for n in sorted(got)]
            g = growth(values)
            rows.append(
                Row(
                    "scaling",
                    f"{shape} {label}: growth per 10× nodes, CPU time "
                    f"({', '.join(f'{n:,}' for n in got)})",
                    max(g) if g else float("nan"),
                    "x",
                    target=f"≤ {GROWTH_TARGET:.0f}× per 10×",
                    met=bool(g) and max(g) <= GROWTH_TARGET and not skipped,
                    note=", ".join(f"{v:.1f}×" for v in g) + skipped,
                )
            )
        if 1_000 in got:
            ours, ref = got[1_000]["build"]
            rows.append(
                Row(
                    "scaling",
                    f"build a 1,000-node {shape}",
                    ours.median * 1e3,
                    "ms",
                    baseline="nn.Sequential of 1,000 modules",
                    baseline_value=ref.median * 1e3,
                    ratio=ours.median / ref.median,
                    cpu_ratio=cpu_ratio(ours, ref),
                    target="≤ 10×",
                    met=ours.median / ref.median <= 10,
                    spread=f"{fmt(ours.min * 1e3, 'ms')} – {fmt(ours.max * 1e3, 'ms')}",
                )
            )
            ours, ref = got[1_000]["module"]
            rows.append(
                Row(
                    "scaling",
                    f"module(g) of a 1,000-node {shape} of nn.Linear nodes",
                    ours.median * 1e3,
                    "ms",
                    baseline="nn.Sequential of 1,000 nn.Linear",
                    baseline_value=ref.median * 1e3,
                    ratio=ours.median / ref.median,
                    cpu_ratio=cpu_ratio(ours, ref),
                    target="≤ 1.5×",
                    met=ours.median / ref.median <= 1.5,
                    spread=f"{fmt(ours.min * 1e3, 'ms')} – {fmt(ours.max * 1e3, 'ms')}",
                    note="registering the modules (the plan is compiled by the first forward: "
                    "the end-to-end row counts it); the floor, one "
                    "nn.Module per node (the node-id level of the names) holding its Linear, "
                    f"made as module(g) makes it: {fmt(floor[0] * 1e3, 'ms')} CPU "
                    f"({floor[1]:.2f}× the baseline, timed apart)",
                )
            )
        if 10_000 in got:
            ours, _ = got[10_000]["build"]
            rows.append(
                Row(
                    "scaling",
                    f"build a 10,000-node {shape}",
                    ours.median * 1e3,
                    "ms",
                    target="< 1 s",
                    met=ours.median < 1.0,
                    spread=f"{fmt(ours.min * 1e3, 'ms')} – {fmt(ours.max * 1e3, 'ms')}",
                )
            )
    rows.append(model_end_to_end(quick))
    rows.append(fork_forward(quick))
    return rows
