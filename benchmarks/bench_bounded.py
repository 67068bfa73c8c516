"""A keeper smaller than an epoch: ``MemoryKeeper(policy="epochs")`` against least recently used.

The recipe's frozen CNN cached per example under ``DataLoader(shuffle=True)``, its keeper
bounded to half of what an epoch stores. Least recently used keeps the rows an epoch read
last, which the next epoch's misses evict before their turn; ``policy="epochs"`` keeps its
entries while they are still read, so each warm epoch finds half of its rows. One warm
epoch (the keepers filled by two epochs before: both at their steady state) of each,
against the same epoch recomputing the backbone, interleaved; CPU time beside wall time,
and what each epoch found (``result.cache``) in the note.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import Row, interleave

import somatize.torch as st
from somatize import Graph, MemoryKeeper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the recipes, importable
from recipes.frozen_backbone import Backbone, Head


def run(quick: bool) -> list[Row]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    n = 2_000 if quick else 4_000
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)

    def graph(keeper: Any) -> Graph:
        torch.manual_seed(0)
        g = Graph.somatize(Backbone(64).with_id("enc") >> Head(512, 10), keeper=keeper)
        g.freeze("enc")
        return g.cache("enc", per="example") if keeper is not None else g

    def fit(g: Graph, epochs: int = 1) -> st.TrainResult:
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, 1e-3),
            epochs=epochs,
            options=st.Options(progress=False),
        )
        return trainer.fit(g, loader)

    probe = MemoryKeeper()
    fit(graph(probe))
    half = probe.stats().bytes // 2
    graphs = {
        "lru": graph(MemoryKeeper(max_bytes=half)),
        "epochs": graph(MemoryKeeper(max_bytes=half, policy="epochs")),
    }
    for g in graphs.values():  # (the bound warned of: the point of this benchmark)
        with _quiet():
            fit(g, epochs=2)
    cpu: dict[str, list[float]] = {}
    found: dict[str, list[float]] = {}

    def epoch(name: str) -> Any:
        def go() -> float:
            g = graphs.get(name) or graph(None)
            wall, c = time.perf_counter(), time.process_time()
            with _quiet():
                result = fit(g)
            cpu.setdefault(name, []).append(time.process_time() - c)
            if name in graphs:
                counts = result.cache["enc"]
                found.setdefault(name, []).append(counts["hits"] / n)
            return time.perf_counter() - wall

        return go

    t = interleave(
        {name: epoch(name) for name in ("recomputed", "lru", "epochs")},
        trials=3 if quick else 5,
    )

    def med(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    ms = {k: v.median * 1e3 for k, v in t.items()}
    share = {k: f"{min(v):.0%}–{max(v):.0%}" for k, v in found.items()}
    return [
        Row(
            "bounded keeper",
            f"frozen CNN, shuffled DataLoader ({n} examples), MemoryKeeper with room for half "
            "of an epoch's rows: a warm epoch with policy='epochs'",
            ms["epochs"],
            "ms",
            baseline="the same with least recently used eviction (the default)",
            baseline_value=ms["lru"],
            ratio=ms["lru"] / ms["epochs"],
            cpu_ratio=med(cpu["lru"]) / med(cpu["epochs"]),
            target="≥ 1.3× (speed-up)",
            met=ms["lru"] / ms["epochs"] >= 1.3,
            spread=f"{t['epochs'].min * 1e3:.0f}–{t['epochs'].max * 1e3:.0f} ms",
            note=(
                f"rows found per warm epoch: policy='epochs' {share['epochs']}, least "
                f"recently used {share['lru']}; the backbone recomputed: {ms['recomputed']:.0f} "
                f"ms an epoch ({ms['recomputed'] / ms['epochs']:.2f}× the policy's, "
                f"{ms['recomputed'] / ms['lru']:.2f}× least recently used's); ratio = speed-up"
            ),
        ),
    ]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The fit's warning that the keeper is bounded below an epoch (what is measured)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield
