"""Level 3: ``fedavg`` of 10 clients × 10M float32 parameters, and a campaign's speed-up.

* fedavg against a straightforward float64 reference (``sum(w * t.double()) / W``)
  and against one pass over the memory (reading every client tensor once, a sum).
* Eight training runs on ``st.executor(workers=2)``, the pool's start included (by the
  default start method, and by a cold and a warm forkserver), against the same eight in
  series.
"""

from __future__ import annotations

import time
from typing import Any

from common import Row, cpu_ratio, interleave, per_call
from fedavg_floors import conversion_pass, float32_pass

import somatize.torch as st


def reference(states: list[dict[str, Any]], weights: list[float]) -> dict[str, Any]:
    total = sum(weights)
    return {k: sum(s[k].double() * w for s, w in zip(states, weights)) / total for k in states[0]}


def train_run(seed: int, epochs: int = 24) -> st.TrainResult:
    import torch
    from torch import nn

    from somatize import Done, Graph, Node, Opaque

    class Dense(Node):
        def __init__(self, i: int, o: int) -> None:
            self.lin = nn.Linear(i, o)

        def forward(self, x: Any, ctx: Any) -> Done:
            return Done(Opaque(torch.relu(self.lin(x))))

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    g = Graph.somatize(Dense(64, 256) >> Dense(256, 256) >> Dense(256, 10))
    data = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(32)]
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps),
        epochs=epochs,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, data)


def run(quick: bool) -> list[Row]:
    import torch

    torch.set_num_threads(1)
    clients, params = 10, (2_000_000 if quick else 10_000_000)
    gen = torch.Generator().manual_seed(0)
    states = [
        {
            "a.weight": torch.randn(params // 2, generator=gen),
            "b.weight": torch.randn(params // 2, generator=gen),
        }
        for _ in range(clients)
    ]
    weights = [float(i + 1) for i in range(clients)]
    t = interleave(
        {
            "fedavg": per_call(lambda: st.fedavg(states, weights=weights), 1),
            "reference": per_call(lambda: reference(states, weights), 1),
            "float32 pass": per_call(lambda: float32_pass(states, weights), 1),
            "conversion": per_call(lambda: conversion_pass(states), 1),
        },
        trials=3 if quick else 5,
    )
    mib = clients * params * 4 / 2**20
    rows = [
        Row(
            "level 3",
            f"fedavg {clients} clients × {params / 1e6:.0f}M float32",
            t["fedavg"].median * 1e3,
            "ms",
            baseline="one float32 accumulation pass",
            baseline_value=t["float32 pass"].median * 1e3,
            ratio=t["fedavg"].median / t["float32 pass"].median,
            target="≤ 2× one pass",
            met=t["fedavg"].median / t["float32 pass"].median <= 2.0,
            note=(
                f"{mib:.0f} MiB read; fedavg accumulates in float64; converting every client "
                f"tensor to float64 alone (nothing summed) takes "
                f"{t['conversion'].median / t['float32 pass'].median:.2f}× the float32 pass"
            ),
            cpu_ratio=cpu_ratio(t["fedavg"], t["float32 pass"]),
        ),
        Row(
            "level 3",
            "fedavg against a float64 reference",
            t["fedavg"].median * 1e3,
            "ms",
            baseline="sum(w * t.double()) / W",
            baseline_value=t["reference"].median * 1e3,
            ratio=t["fedavg"].median / t["reference"].median,
            note="ratio < 1: fedavg is faster",
        ),
    ]

    rows.extend(campaign(quick))
    return rows


def timed_run(seed: int) -> tuple[int, float]:
    """``train_run``: the process that ran it, and the CPU seconds it took there."""
    import os

    cpu = time.process_time()
    train_run(seed)
    return os.getpid(), time.process_time() - cpu


def _stop_forkserver() -> None:
    """Stop the process's forkserver, so the next pool starts cold (preload included)."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # type: ignore[attr-defined]
    if stop is not None:
        stop()


def campaign(quick: bool) -> list[Row]:
    """Eight runs on ``st.executor(workers=2)``, the pool's start-up included, against the
    same eight in series in this process (warmed by one run first). Three pools: the
    default (``fork`` on Linux when it is safe: workers start with what this process
    imported), and ``start_method="forkserver"`` cold (the process's forkserver stopped
    first, so its start and preload are paid again, as by a script's first pool) and
    warm (a later pool, the forkserver up)."""
    runs = 8
    train_run(0, epochs=1)  # the serial side at its best: imports and allocator warm

    def serial() -> tuple[float, float]:
        cpu, start = time.process_time(), time.perf_counter()
        for seed in range(runs):
            train_run(seed)
        return time.perf_counter() - start, time.process_time() - cpu

    def pooled(method: Any, cold: bool) -> float:
        if cold:
            _stop_forkserver()
        cpu, start = time.process_time(), time.perf_counter()
        with st.executor(workers=2, start_method=method) as pool:
            out = list(pool.map(timed_run, range(runs)))
            methods.add(pool.start_method)
        wall = time.perf_counter() - start
        per_worker: dict[int, float] = {}
        for pid, dt in out:
            per_worker[pid] = per_worker.get(pid, 0.0) + dt
        paths.setdefault(method, []).append(time.process_time() - cpu + max(per_worker.values()))
        return wall

    methods: set[str] = set()
    paths: dict[Any, list[float]] = {}  # the parent's CPU time plus the busiest worker's runs'
    kinds = {
        "default": (None, True),
        "forkserver cold": ("forkserver", True),
        "forkserver warm": ("forkserver", False),
    }
    samples: dict[str, list[float]] = {"serial": [], "serial cpu": [], **{k: [] for k in kinds}}
    for _ in range(1 if quick else 3):  # interleaved: serial, each pool, serial...
        wall, cpu = serial()
        samples["serial"].append(wall)
        samples["serial cpu"].append(cpu)
        for kind, (method, cold) in kinds.items():
            if kind == "default":
                methods.clear()
            samples[kind].append(pooled(method, cold))
            if kind == "default":
                default = "/".join(sorted(methods))
    med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    loaded = med["serial"] / med["serial cpu"] if med["serial cpu"] else 1.0
    rows = []
    for kind, what in (
        ("default", f"the default start method ({default}): workers' start and first runs included"),
        ("forkserver cold", "start_method='forkserver', a cold forkserver: its start and preload included"),
        ("forkserver warm", "start_method='forkserver', the forkserver already up"),
    ):  # fmt: skip
        speedup = med["serial"] / med[kind]
        target = kind == "default"
        path, cpu_speedup = "", None
        if target:
            cp = sorted(paths[None])[len(paths[None]) // 2]
            cpu_speedup = med["serial cpu"] / cp
            path = (
                f"; CPU critical path {cp:.2f} s against serial's {med['serial cpu']:.2f} s "
                f"({med['serial cpu'] / cp:.2f}×: this process's CPU time plus the busiest "
                "worker's runs', its start-up left out)"
            )
        rows.append(
            Row(
                "level 3",
                f"campaign of {runs} runs on st.executor(workers=2), pool start included, {kind}",
                med[kind],
                "s",
                baseline="the same runs in series",
                baseline_value=med["serial"],
                ratio=speedup,
                target="≥ 1.5× speed-up" if target else "",
                met=speedup >= 1.5 if target else None,
                spread=f"{min(samples[kind]):.2f} – {max(samples[kind]):.2f} s",
                cpu_ratio=cpu_speedup,
                note=(
                    f"ratio = speed-up; {what}{path}; serial wall/CPU = {loaded:.2f} "
                    "(1.00 on an idle machine; above, the two workers share the cores)"
                ),
            )
        )
    return rows
