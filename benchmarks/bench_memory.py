"""Per-example memory: a frozen backbone under a shuffled DataLoader, a sweep sharing it.

* A frozen encoder (4 × 512-wide MLP) + linear head, ``DataLoader(shuffle=True,
  batch_size=64)``: one warm epoch with the encoder cached per example
  (``g.cache("enc", per="example")``) against the same epoch recomputing the encoder,
  and against an epoch over features precomputed by hand (the floor). Epoch 1 (every
  row a miss: keys, the node, the writes) against a plain epoch, with a MemoryKeeper
  and with a DiskKeeper.
* A sweep of 8 head configurations sharing one DiskKeeper against the same sweep
  uncached (total time, the cache's first fill included).
* The per-example key: µs per 64-float row, for a batch of 10,000 rows.

Epoch timings are interleaved (A B C A B C ...); CPU time is reported beside wall time.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from common import Row, Timing, interleave

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node, Opaque


class Encoder(Node):
    def __init__(self, i: int, h: int) -> None:
        from torch import nn

        layers: list[Any] = [nn.Linear(i, h)]
        for _ in range(3):
            layers += [nn.ReLU(), nn.Linear(h, h)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.net(x)))


class Head(Node):
    def __init__(self, h: int, classes: int) -> None:
        from torch import nn

        self.out = nn.Linear(h, classes)

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.out(x)))


def spread(t: Timing, scale: float) -> str:
    return f"{t.min * scale:.3g}–{t.max * scale:.3g}"


def run(quick: bool) -> list[Row]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from somatize.torch.rows import TensorRows

    torch.set_num_threads(1)
    n = 2_000 if quick else 10_000
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)

    def graph(cached: bool, keeper: Any = None) -> Graph:
        torch.manual_seed(0)
        g = Graph.somatize(Encoder(64, 512).with_id("enc") >> Head(512, 10), keeper=keeper)
        g.freeze("enc")
        return g.cache("enc", per="example") if cached else g

    def trainer(lr: float = 1e-3, epochs: int = 1) -> st.Trainer:
        return st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, lr),
            epochs=epochs,
            options=st.Options(progress=False),
        )

    def timed(fn: Any) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - wall, time.process_time() - cpu

    cpu: dict[str, list[float]] = {}

    def epoch(name: str, make: Any) -> Any:
        def go() -> float:
            g = make()
            wall, c = timed(lambda: trainer().fit(g, loader))
            cpu.setdefault(name, []).append(c)
            return wall

        return go

    warm = graph(True, MemoryKeeper())
    trainer().fit(warm, loader)  # fills the cache: every later epoch is warm
    with torch.no_grad():
        features = warm["enc"].net(x)
    pre = Graph.somatize(Head(512, 10))
    pre_loader = DataLoader(TensorDataset(features, y), batch_size=64, shuffle=True)
    disk_dirs: list[str] = []

    def cold_disk() -> Graph:
        disk_dirs.append(tempfile.mkdtemp(prefix="smz-bench-"))
        return graph(True, DiskKeeper(disk_dirs[-1]))

    def pre_epoch() -> float:
        wall, c = timed(lambda: trainer().fit(pre, pre_loader))
        cpu.setdefault("precomputed", []).append(c)
        return wall

    t = interleave(
        {
            "recomputed": epoch("recomputed", lambda: graph(False)),
            "warm": epoch("warm", lambda: warm),
            "precomputed": pre_epoch,
            "cold memory": epoch("cold memory", lambda: graph(True, MemoryKeeper())),
            "cold disk": epoch("cold disk", cold_disk),
        },
        trials=3 if quick else 5,
    )

    def med(name: str) -> float:
        return t[name].median * 1e3

    def cpu_ms(name: str) -> str:
        s = sorted(cpu[name])
        return f"cpu {s[len(s) // 2] * 1e3:.0f} ms"

    rows = [
        Row(
            "memory",
            f"frozen 4×512 MLP, shuffled DataLoader, warm epoch ({n} examples)",
            med("warm"),
            "ms",
            baseline="encoder recomputed",
            baseline_value=med("recomputed"),
            ratio=med("recomputed") / med("warm"),
            target="≥ 5×",
            met=med("recomputed") / med("warm") >= 5,
            spread=spread(t["warm"], 1e3),
            note=f"ratio = speed-up; {cpu_ms('warm')} vs {cpu_ms('recomputed')}",
        ),
        Row(
            "memory",
            "warm epoch against features precomputed by hand",
            med("warm"),
            "ms",
            baseline="precomputed features",
            baseline_value=med("precomputed"),
            ratio=med("warm") / med("precomputed"),
            target="aim ≤ 1.3×",
            met=med("warm") / med("precomputed") <= 1.3,
            note=f"{cpu_ms('precomputed')}",
        ),
        Row(
            "memory",
            "epoch 1 (all misses), MemoryKeeper",
            med("cold memory"),
            "ms",
            baseline="plain epoch",
            baseline_value=med("recomputed"),
            ratio=med("cold memory") / med("recomputed"),
            target="≤ 1.2×",
            met=med("cold memory") / med("recomputed") <= 1.2,
            note=cpu_ms("cold memory"),
        ),
        Row(
            "memory",
            "epoch 1 (all misses), DiskKeeper",
            med("cold disk"),
            "ms",
            baseline="plain epoch",
            baseline_value=med("recomputed"),
            ratio=med("cold disk") / med("recomputed"),
            target="≤ 1.5×",
            met=med("cold disk") / med("recomputed") <= 1.5,
            note=cpu_ms("cold disk"),
        ),
    ]

    # A sweep of 8 head configurations: one DiskKeeper shared, against none.
    configs = [1e-3 * (i + 1) for i in range(8)]
    sweep_n = n // 2
    sweep_loader = DataLoader(TensorDataset(x[:sweep_n], y[:sweep_n]), batch_size=64, shuffle=True)

    def sweep(cached: bool) -> float:
        keeper_dir = tempfile.mkdtemp(prefix="smz-sweep-")
        start = time.perf_counter()
        for lr in configs:
            g = graph(cached, DiskKeeper(keeper_dir) if cached else None)
            trainer(lr, epochs=2).fit(g, sweep_loader)
        return time.perf_counter() - start

    s = interleave(
        {"uncached": lambda: sweep(False), "shared": lambda: sweep(True)}, trials=1, warmup=0
    )
    rows.append(
        Row(
            "memory",
            f"sweep of 8 heads × 2 epochs, one DiskKeeper ({sweep_n} examples)",
            s["shared"].median,
            "s",
            baseline="the same sweep uncached",
            baseline_value=s["uncached"].median,
            ratio=s["uncached"].median / s["shared"].median,
            target="≥ 4×",
            met=s["uncached"].median / s["shared"].median >= 4,
            note="ratio = speed-up, the cache's first fill included",
        )
    )

    # The per-example key: one keyed blake3 per row over a view of the batch's bytes.
    rows_codec, batch = TensorRows(), torch.randn(10_000, 64, generator=gen)
    salt = b"s" * 32

    def keys() -> float:
        start = time.perf_counter()
        rows_codec.keys(batch, salt)
        return (time.perf_counter() - start) / batch.shape[0]

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
