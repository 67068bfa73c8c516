"""Per-node dispatch overhead on the hot path: chains of 3 and 30 identity nodes, eager.

The cost of one node is the slope between the two chains, ``(t30 - t3) / 27``, so the
fixed cost of a call cancels out. Baselines in the same run: a plain Python function
call per link, and ``nn.Module.__call__`` per link (``nn.Identity`` in a loop).
"""

from __future__ import annotations

from typing import Any

from common import Row, interleave, per_call

from somatize import Done, Graph, Node, Opaque


class Identity(Node):
    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(x))


def chain(n: int) -> Graph:
    expr: Any = Identity()
    for _ in range(n - 1):
        expr = expr >> Identity()
    return Graph.somatize(expr)


def run(quick: bool) -> list[Row]:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    number = 2_000 if quick else 20_000
    x = Opaque(torch.zeros(1))
    g3, g30 = chain(3), chain(30)

    def plain(v: Any) -> Any:
        return v

    def plain_chain(n: int) -> Any:
        def call() -> Any:
            v = x
            for _ in range(n):
                v = plain(v)
            return v

        return call

    mods3 = [nn.Identity() for _ in range(3)]
    mods30 = [nn.Identity() for _ in range(30)]

    def module_chain(mods: list[nn.Module]) -> Any:
        t = x.value

        def call() -> Any:
            v = t
            for m in mods:
                v = m(v)
            return v

        return call

    t = interleave(
        {
            "somatize 3": per_call(lambda: g3.forward(x), number),
            "somatize 30": per_call(lambda: g30.forward(x), number),
            "python 3": per_call(plain_chain(3), number),
            "python 30": per_call(plain_chain(30), number),
            "module 3": per_call(module_chain(mods3), number),
            "module 30": per_call(module_chain(mods30), number),
        },
        trials=5 if quick else 9,
    )

    def slope(name: str) -> tuple[float, float, float]:
        a, b = t[f"{name} 3"], t[f"{name} 30"]
        return (
            (b.median - a.median) / 27 * 1e6,
            max(0.0, (b.min - a.max) / 27 * 1e6),
            (b.max - a.min) / 27 * 1e6,
        )

    def cpu_slope(name: str) -> float | None:
        a, b = t[f"{name} 3"].cpu, t[f"{name} 30"].cpu
        return None if a is None or b is None else (b.median - a.median) / 27 * 1e6

    som, py, mod = slope("somatize"), slope("python"), slope("module")
    som_cpu, py_cpu, mod_cpu = cpu_slope("somatize"), cpu_slope("python"), cpu_slope("module")
    rows = [
        Row(
            "dispatch",
            "per node, somatize hot path",
            som[0],
            "µs",
            baseline="plain Python call",
            baseline_value=py[0],
            ratio=som[0] / py[0] if py[0] else None,
            cpu_ratio=som_cpu / py_cpu if som_cpu and py_cpu else None,
            target="< 1 µs per node",
            met=som[0] < 1.0,
            spread=f"{som[1]:.2f} – {som[2]:.2f} µs",
            note="a node's forward, its Done and Opaque included"
            + (f"; in CPU time {som_cpu:.2f} µs" if som_cpu is not None else ""),
        ),
        Row(
            "dispatch",
            "per link, nn.Module.__call__",
            mod[0],
            "µs",
            baseline="somatize node",
            baseline_value=som[0],
            ratio=mod[0] / som[0] if som[0] else None,
            cpu_ratio=mod_cpu / som_cpu if mod_cpu and som_cpu else None,
            spread=f"{mod[1]:.2f} – {mod[2]:.2f} µs",
        ),
        Row(
            "dispatch",
            "whole call, 3-node graph",
            t["somatize 3"].median * 1e6,
            "µs",
            spread=f"{t['somatize 3'].min * 1e6:.2f} – {t['somatize 3'].max * 1e6:.2f} µs",
        ),
    ]
    return rows
