"""Training step: a plain PyTorch loop vs the somatize Trainer vs Lightning's Trainer.

Each candidate trains the same model on the same batches with Adam. The time per
step is the slope between runs of N1 and N2 steps, so set-up and tear-down cancel;
set-up + tear-down is reported separately (a 1-step fit minus one step). Lightning
runs with logger, checkpointing, progress bar and model summary off. Wall time is
reported with the process's CPU time beside it (``time.process_time``), so a loaded
machine neither hides nor invents a difference. The null model (one 1×1 linear layer,
batch 1) measures the Trainer's own cost per step over a plain loop (issue 16: ≤ +8 µs).
"""

from __future__ import annotations

import itertools
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

from common import Row, Timing, interleave

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Dense(Node):
    def __init__(self, i: int, o: int, relu: bool = True) -> None:
        import torch.nn as nn

        self.lin = nn.Linear(i, o)
        self.relu = relu

    def forward(self, x: Any, ctx: Any) -> Done:
        import torch

        y = self.lin(x)
        return Done(Opaque(torch.relu(y) if self.relu else y))


def make_graph(sizes: list[int]) -> Graph:
    layers: Any = None
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        node = Dense(a, b, relu=i < len(sizes) - 2)
        layers = node if layers is None else layers >> node
    return Graph.somatize(layers)


def make_plain(sizes: list[int]) -> Any:
    import torch.nn as nn

    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        mods.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def candidates(sizes: list[int], batch: int) -> dict[str, Callable[[int], float]]:
    import lightning as L
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(0)
    data = [
        (
            torch.randn(batch, sizes[0], generator=gen),
            torch.randint(0, sizes[-1], (batch,), generator=gen),
        )
        for _ in range(64)
    ]

    def batches(n: int) -> list[Any]:
        return [data[i % len(data)] for i in range(n)]

    def plain(n: int) -> float:
        start = time.perf_counter()
        model = make_plain(sizes)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        model.train()
        for x, y in batches(n):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        return time.perf_counter() - start

    def somatize(n: int) -> float:
        start = time.perf_counter()
        g = make_graph(sizes)
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3),
            max_steps=n,
            options=st.Options(shuffle=False, progress=False),
        )
        trainer.fit(g, batches(n))
        return time.perf_counter() - start

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = make_plain(sizes)

        def training_step(self, b: Any, i: int) -> Any:
            x, y = b
            return nn.functional.cross_entropy(self.model(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    def lightning(n: int) -> float:
        start = time.perf_counter()
        trainer = L.Trainer(
            max_steps=n,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
            num_sanity_val_steps=0,
        )
        loader = torch.utils.data.DataLoader(batches(n), batch_size=None, shuffle=False)
        trainer.fit(Module(), loader)
        return time.perf_counter() - start

    return {"plain PyTorch": plain, "somatize Trainer": somatize, "Lightning Trainer": lightning}


def run(quick: bool) -> list[Row]:
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    rows = []
    n1, n2 = (20, 120) if quick else (50, 1050)
    for case, sizes, batch in (
        ("null model 1-1, batch 1", [1, 2], 1),
        ("MLP 64-128-128-10, batch 64", [64, 128, 128, 10], 64),
        ("tiny 16-16-2, batch 8", [16, 16, 2], 8),
    ):
        fns = candidates(sizes, batch)
        timed: dict[str, Callable[[], float]] = {}
        cpu: dict[str, list[float]] = {}

        def with_cpu(
            key: str, fn: Callable[[int], float], n: int, cpu: dict[str, list[float]] = cpu
        ) -> Callable[[], float]:
            def run() -> float:
                c = time.process_time()
                wall = fn(n)
                cpu.setdefault(key, []).append(time.process_time() - c)
                return wall

            return run

        for name, fn in fns.items():
            timed[f"{name} short"] = with_cpu(f"{name} short", fn, n1)
            timed[f"{name} long"] = with_cpu(f"{name} long", fn, n2)
            timed[f"{name} one"] = with_cpu(f"{name} one", fn, 1)
        trials = 3 if quick else 7
        t = interleave(timed, trials=trials)

        def cpu_step(  # the CPU-time slope, over the timed trials only
            name: str, cpu: dict[str, list[float]] = cpu, trials: int = trials
        ) -> float:
            a = statistics.median(cpu[f"{name} short"][-trials:])
            b = statistics.median(cpu[f"{name} long"][-trials:])
            return (b - a) / (n2 - n1)

        step: dict[str, Timing] = {}
        for name in fns:
            a, b = t[f"{name} short"], t[f"{name} long"]
            d = n2 - n1
            step[name] = Timing(
                (b.median - a.median) / d,
                max(0.0, (b.min - a.max) / d),
                (b.max - a.min) / d,
                a.trials,
            )
        plain, som, light = (
            step["plain PyTorch"],
            step["somatize Trainer"],
            step["Lightning Trainer"],
        )
        tiny, null = case.startswith("tiny"), case.startswith("null")
        cpu_note = (
            f"CPU time per step: somatize {cpu_step('somatize Trainer') * 1e6:.1f} µs, plain "
            f"{cpu_step('plain PyTorch') * 1e6:.1f} µs, Lightning "
            f"{cpu_step('Lightning Trainer') * 1e6:.1f} µs"
        )
        if null:
            extra = (som.median - plain.median) * 1e6
            rows.append(
                Row(
                    "training step",
                    f"{case}: somatize step over plain",
                    extra,
                    "µs",
                    baseline="plain PyTorch loop",
                    baseline_value=plain.median * 1e6,
                    ratio=som.median / plain.median,
                    target="≤ +8 µs",
                    met=extra <= 8,
                    spread=f"{som.min * 1e6:.0f} – {som.max * 1e6:.0f} µs a step",
                    note=(
                        f"{cpu_note}; CPU overhead "
                        f"{(cpu_step('somatize Trainer') - cpu_step('plain PyTorch')) * 1e6:+.1f} µs"
                    ),
                )
            )
        rows.append(
            Row(
                "training step",
                f"{case}: somatize vs plain",
                som.median * 1e6,
                "µs",
                baseline="plain PyTorch loop",
                baseline_value=plain.median * 1e6,
                ratio=som.median / plain.median,
                target="" if tiny or null else "≤ 1.05× plain",
                met=None if tiny or null else som.median / plain.median <= 1.05,
                spread=f"{som.min * 1e6:.0f} – {som.max * 1e6:.0f} µs",
                note=cpu_note,
            )
        )
        rows.append(
            Row(
                "training step",
                f"{case}: Lightning vs somatize",
                light.median * 1e6,
                "µs",
                baseline="somatize Trainer",
                baseline_value=som.median * 1e6,
                ratio=light.median / som.median,
                target="≥ 2× (somatize faster)" if tiny else "",
                met=light.median / som.median >= 2 if tiny else None,
                spread=f"{light.min * 1e6:.0f} – {light.max * 1e6:.0f} µs",
            )
        )
        # Fixed cost beyond a plain loop's (which also builds the model and optimizer).
        fixed = t["plain PyTorch one"].median - plain.median
        setup = t["somatize Trainer one"].median - som.median - fixed
        rows.append(
            Row(
                "training step",
                f"{case}: somatize fit() set-up + tear-down",
                setup * 1e3,
                "ms",
                baseline="Lightning set-up + tear-down",
                baseline_value=(t["Lightning Trainer one"].median - light.median - fixed) * 1e3,
                target="< 1 ms",
                met=setup < 1e-3,
                note="a 1-step run minus one step, minus a plain loop's own fixed cost; no watchers",
            )
        )
    return rows
