"""Caching: a frozen encoder + trainable head, the encoder cached vs recomputed; key costs.

* Epochs 2..N of training with the frozen encoder cached (``g.cache``) against the
  same graph with the encoder frozen but recomputed every epoch: the per-epoch
  speed-up. Batches repeat each epoch (``shuffle=False``): caching is by content.
* The key of small data: ``digest`` of a short sentence and of a small dict.
* Tensor hashing throughput: ``digest`` of a 32 MiB tensor through the tensor codec
  against raw blake3 over the same bytes.
"""

from __future__ import annotations

import time
from typing import Any

from common import Row, interleave, per_call

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, digest


class Encoder(Node):
    def __init__(self, i: int, h: int) -> None:
        from torch import nn

        self.net = nn.Sequential(
            nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h)
        )

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(self.net(x))  # frozen: no grad, so a detached tensor — data, cacheable


class Head(Node):
    def __init__(self, h: int, classes: int) -> None:
        from torch import nn

        self.out = nn.Linear(h, classes)

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.out(x)))


def run(quick: bool) -> list[Row]:
    import torch
    from blake3 import blake3
    from torch import nn

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(64, 64, generator=gen), torch.randint(0, 10, (64,), generator=gen))
        for _ in range(16)
    ]
    epochs = 3 if quick else 6

    def fit(cached: bool, n_epochs: int) -> float:
        torch.manual_seed(0)
        g = Graph.somatize(Encoder(64, 512).with_id("enc") >> Head(512, 10))
        g.freeze("enc")
        if cached:
            g.cache("enc")
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, 1e-3),
            epochs=n_epochs,
            options=st.Options(shuffle=False, progress=False),
        )
        start = time.perf_counter()
        trainer.fit(g, data)
        return time.perf_counter() - start

    t = interleave(
        {
            "cached 1": lambda: fit(True, 1),
            "cached N": lambda: fit(True, epochs),
            "recomputed 1": lambda: fit(False, 1),
            "recomputed N": lambda: fit(False, epochs),
        },
        trials=3 if quick else 5,
    )
    per_epoch_cached = (t["cached N"].median - t["cached 1"].median) / (epochs - 1)
    per_epoch_plain = (t["recomputed N"].median - t["recomputed 1"].median) / (epochs - 1)
    rows = [
        Row(
            "caching",
            "frozen encoder, epochs 2..N: cached",
            per_epoch_cached * 1e3,
            "ms",
            baseline="recomputed every epoch",
            baseline_value=per_epoch_plain * 1e3,
            ratio=per_epoch_plain / per_epoch_cached,
            note="ratio = speed-up per epoch",
        ),
        Row(
            "caching",
            "first epoch: cached (keys + writes)",
            t["cached 1"].median * 1e3,
            "ms",
            baseline="recomputed",
            baseline_value=t["recomputed 1"].median * 1e3,
            ratio=t["cached 1"].median / t["recomputed 1"].median,
        ),
    ]

    sentence = "the quick brown fox jumps over the lazy dog"
    small = {"ids": [101, 2023, 2003, 102], "lang": "en", "weight": 0.5}
    number = 20_000 if quick else 200_000
    k = interleave(
        {
            "sentence": per_call(lambda: digest(sentence), number),
            "dict": per_call(lambda: digest(small), number),
            "raw": per_call(lambda: blake3(sentence.encode()).hexdigest(), number),
        },
        trials=5,
    )
    for name, value in (("a 43-character str", "sentence"), ("a small dict", "dict")):
        us = k[value].median * 1e6
        rows.append(
            Row(
                "caching",
                f"key of {name}",
                us,
                "µs",
                baseline="raw blake3 of the str",
                baseline_value=k["raw"].median * 1e6,
                ratio=us / (k["raw"].median * 1e6),
                target="≤ 3 µs",
                met=us <= 3.0,
            )
        )

    codecs = st.module(Graph.somatize(Head(4, 2))).graph.codecs
    tensor = torch.randn(8 * 1024 * 1024, generator=gen)  # 32 MiB
    raw = memoryview(tensor.numpy()).cast("B")
    reps = 3 if quick else 10
    h = interleave(
        {
            "codec": per_call(lambda: digest(tensor, codecs), reps),
            "blake3": per_call(lambda: blake3(raw).hexdigest(), reps),
        },
        trials=5,
    )
    mib = tensor.numel() * 4 / 2**20
    throughput = mib / h["codec"].median
    rows.append(
        Row(
            "caching",
            "tensor hashing throughput (32 MiB)",
            throughput,
            "MiB/s",
            baseline="raw blake3, same bytes",
            baseline_value=mib / h["blake3"].median,
            ratio=h["blake3"].median / h["codec"].median,
            target="≥ 90% of raw blake3",
            met=h["blake3"].median / h["codec"].median >= 0.9,
            note="ratio = fraction of raw blake3 throughput",
        )
    )
    return rows
