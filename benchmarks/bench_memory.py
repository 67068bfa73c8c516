"""Per-example memory: a frozen backbone under a shuffled DataLoader, a sweep sharing it.

* A small frozen CNN (two 3×3 convolutions, 64 and 128 channels, over 8×8 inputs given
  as 64-float rows) + linear head, ``DataLoader(shuffle=True, batch_size=64)``: one warm
  epoch with the backbone
  cached per example (``g.cache("enc", per="example")``) against the same epoch
  recomputing it, and against an epoch over features precomputed by hand (the floor).
  Epoch 1 (every row a miss: keys, the node, the writes) against a plain epoch, with a
  MemoryKeeper and with a DiskKeeper.
* The same warm epoch with a cheap backbone (a 4 × 512-wide MLP): there the DataLoader
  and the head's step are most of an epoch, which bounds any cache's speed-up.
* A sweep of 8 head configurations sharing one DiskKeeper against the same sweep
  uncached (total time, the cache's first fill included): the runs on one DiskKeeper;
  each run with its own handle on the directory (as runs in separate processes, each
  reading the directory once); and all through one TieredKeeper (a MemoryKeeper in
  front of the DiskKeeper).
* The per-example key: µs per 64-float row, for a batch of 10,000 rows.
* Where a warm batch goes: one more warm epoch with the cached node's steps timed
  (``warm_batch.py``), in the note of the row against precomputed features.

Epoch timings are interleaved (A B C A B C ...); CPU time is reported beside wall time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Row, Timing, interleave
from warm_batch import breakdown

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node, Opaque, TieredKeeper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the recipes, importable
from recipes.frozen_backbone import Backbone as Conv  # the recipe's CNN, measured
from recipes.frozen_backbone import Head


class Encoder(Node):
    def __init__(self, i: int, h: int) -> None:
        from torch import nn

        layers: list[Any] = [nn.Linear(i, h)]
        for _ in range(3):
            layers += [nn.ReLU(), nn.Linear(h, h)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.net(x)))


def spread(t: Timing, scale: float) -> str:
    return f"{t.min * scale:.3g}–{t.max * scale:.3g}"


def run(quick: bool) -> list[Row]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from somatize.torch.rows import TensorRows

    torch.set_num_threads(1)
    n = 2_000 if quick else 10_000  # the 10k examples
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    backbones = {"cnn": (lambda: Conv(64), 512), "mlp": (lambda: Encoder(64, 512), 512)}

    def graph(cached: bool, keeper: Any = None, kind: str = "cnn") -> Graph:
        make, width = backbones[kind]
        torch.manual_seed(0)
        g = Graph.somatize(make().with_id("enc") >> Head(width, 10), keeper=keeper)
        g.freeze("enc")
        return g.cache("enc", per="example") if cached else g

    def trainer(lr: float = 1e-3, epochs: int = 1) -> st.Trainer:
        return st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, lr),
            epochs=epochs,
            options=st.Options(progress=False),
        )

    cpu: dict[str, list[float]] = {}

    def epoch(name: str, make: Any, data: Any = loader) -> Any:
        def go() -> float:
            g = make()
            wall, c = time.perf_counter(), time.process_time()
            trainer().fit(g, data)
            cpu.setdefault(name, []).append(time.process_time() - c)
            return time.perf_counter() - wall

        return go

    warm, warm_mlp = graph(True, MemoryKeeper()), graph(True, MemoryKeeper(), "mlp")
    for g in (warm, warm_mlp):
        trainer().fit(g, loader)  # fills the cache: every later epoch is warm
    with torch.no_grad():
        features = warm["enc"].net(x)
    pre = Graph.somatize(Head(512, 10))
    pre_loader = DataLoader(TensorDataset(features, y), batch_size=64, shuffle=True)

    t = interleave(
        {
            "recomputed": epoch("recomputed", lambda: graph(False)),
            "warm": epoch("warm", lambda: warm),
            "precomputed": epoch("precomputed", lambda: pre, pre_loader),
            "cold memory": epoch("cold memory", lambda: graph(True, MemoryKeeper())),
            "cold disk": epoch(
                "cold disk", lambda: graph(True, DiskKeeper(tempfile.mkdtemp(prefix="smz-")))
            ),
            "mlp recomputed": epoch("mlp recomputed", lambda: graph(False, None, "mlp")),
            "mlp warm": epoch("mlp warm", lambda: warm_mlp),
        },
        trials=3 if quick else 5,
    )

    def med(name: str) -> float:
        return t[name].median * 1e3

    def cpu_ms(name: str) -> str:
        s = sorted(cpu[name])
        return f"cpu {s[len(s) // 2] * 1e3:.0f} ms"

    def cpu_med(name: str) -> float:
        s = sorted(cpu[name])
        return s[len(s) // 2]

    def row(
        case: str, name: str, base: str, base_name: str, target: float | None, **kw: Any
    ) -> Row:
        ratio = med(name) / med(base_name)
        by_cpu = cpu_med(name) / cpu_med(base_name)
        speedup = kw.pop("speedup", False)
        ratio, by_cpu = (1 / ratio, 1 / by_cpu) if speedup else (ratio, by_cpu)
        return Row(
            "memory",
            case,
            med(name),
            "ms",
            baseline=base,
            baseline_value=med(base_name),
            ratio=ratio,
            cpu_ratio=by_cpu,
            target=f"{'≥' if speedup else '≤'} {target:g}×" if target is not None else "",
            met=None if target is None else ratio >= target if speedup else ratio <= target,
            spread=spread(t[name], 1e3),
            note=f"{cpu_ms(name)} vs {cpu_ms(base_name)}" + kw.pop("note", ""),
        )

    rows = [
        row(
            f"frozen CNN, shuffled DataLoader, warm epoch ({n} examples)",
            "warm",
            "backbone recomputed",
            "recomputed",
            5,
            speedup=True,
            note="; ratio = speed-up",
        ),
        row(
            "warm epoch against features precomputed by hand",
            "warm",
            "precomputed features",
            "precomputed",
            1.3,
            note="; in one more warm epoch, timed step by step: "
            + breakdown(lambda: trainer().fit(warm, loader), len(loader)),
        ),
        row("epoch 1 (all misses), MemoryKeeper", "cold memory", "plain epoch", "recomputed", 1.2),
        row("epoch 1 (all misses), DiskKeeper", "cold disk", "plain epoch", "recomputed", 1.5),
        row(
            "cheap backbone (4 × 512 MLP), warm epoch",
            "mlp warm",
            "MLP recomputed",
            "mlp recomputed",
            None,  # the issue's ≥ 5× is measured on the CNN above (its "or a small CNN")
            speedup=True,
            note="; informational: the DataLoader and the head's step, the same cached or "
            "not, are a third of a recomputed epoch, so no cache can reach 5× here",
        ),
    ]

    # A sweep of 8 head configurations: one DiskKeeper shared, against none.
    configs = [1e-3 * (i + 1) for i in range(8)]
    sweep_n = n // 2
    sweep_loader = DataLoader(TensorDataset(x[:sweep_n], y[:sweep_n]), batch_size=64, shuffle=True)

    def sweep(mode: str) -> float:
        """8 runs: uncached; all on one DiskKeeper; each on its own DiskKeeper handle on
        the directory (as separate processes would be); or in one process through one
        TieredKeeper (a MemoryKeeper in front)."""
        keeper_dir = tempfile.mkdtemp(prefix="smz-sweep-")
        shared = DiskKeeper(keeper_dir)
        tiered = TieredKeeper(MemoryKeeper(), DiskKeeper(keeper_dir))
        start = time.perf_counter()
        for lr in configs:
            keeper = {
                "shared": lambda: shared,
                "disk": lambda: DiskKeeper(keeper_dir),
                "tiered": lambda: tiered,
            }.get(mode)
            g = graph(mode != "uncached", keeper() if keeper else None)
            trainer(lr, epochs=2).fit(g, sweep_loader)
        return time.perf_counter() - start

    s = interleave(  # (three trials: with two, one slow sweep moved a ratio by 10%)
        {m: (lambda m=m: sweep(m)) for m in ("uncached", "shared", "disk", "tiered")},
        trials=2 if quick else 3,
        warmup=0,
    )
    for mode, how in (
        ("shared", "one DiskKeeper shared by the runs"),
        ("disk", "one DiskKeeper directory, a handle per run (as separate processes)"),
        ("tiered", "one TieredKeeper(MemoryKeeper(), DiskKeeper(dir)) in one process"),
    ):
        ratio = s["uncached"].median / s[mode].median
        rows.append(
            Row(
                "memory",
                f"sweep of 8 heads × 2 epochs, {how} ({sweep_n} examples)",
                s[mode].median,
                "s",
                baseline="the same sweep uncached",
                baseline_value=s["uncached"].median,
                ratio=ratio,
                target="≥ 4×",
                met=ratio >= 4,
                note="ratio = speed-up, the cache's first fill included",
            )
        )

    # The per-example key: one keyed blake3 per row over a view of the batch's bytes.
    rows_codec, batch = TensorRows(), torch.randn(10_000, 64, generator=gen)
    salt = b"s" * 32

    def keys() -> float:  # CPU time: one thread, so a loaded machine does not inflate it
        start = time.process_time()
        rows_codec.keys(batch, salt)
        return (time.process_time() - start) / batch.shape[0]

    k = interleave({"keys": keys}, trials=7)
    us = k["keys"].median * 1e6
    rows.append(
        Row(
            "memory",
            "per-example key, 64-float rows (batch of 10,000)",
            us,
            "µs",
            target="≤ 1 µs",
            met=us <= 1.0,
            spread=spread(k["keys"], 1e6),
        )
    )
    return rows
