"""The cost around a federated round (``bench_federated``): ``fedavg`` of 100 clients × 1M
float32 parameters against one float32 accumulation pass and a float64 reference, and a
Dirichlet partition of 100k examples × 1,000 clients with one round's sample."""

from __future__ import annotations

import torch
from common import Row, cpu_ratio, interleave, per_call
from fedavg_floors import conversion_pass, float32_pass


def fedavg_rows(quick: bool) -> list[Row]:
    import somatize.torch as st

    clients, params = (20, 1_000_000) if quick else (100, 1_000_000)
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(params, generator=gen)} for _ in range(clients)]
    weights = [float(i + 1) for i in range(clients)]

    t = interleave(
        {
            "fedavg": per_call(lambda: st.fedavg(states, weights=weights), 1),
            "float32 pass": per_call(lambda: float32_pass(states, weights), 1),
            "conversion": per_call(lambda: conversion_pass(states), 1),
        },
        trials=3 if quick else 5,
    )
    exact = st.fedavg(states, weights=weights)["w"].double()
    ref = sum(s["w"].double() * w for s, w in zip(states, weights)) / sum(weights)
    err = float((exact - ref).abs().max())
    ratio = t["fedavg"].median / t["float32 pass"].median
    return [
        Row(
            "federated",
            f"fedavg {clients} clients × {params / 1e6:.0f}M float32",
            t["fedavg"].median * 1e3,
            "ms",
            baseline="one float32 accumulation pass",
            baseline_value=t["float32 pass"].median * 1e3,
            ratio=ratio,
            target="≤ 1.5× one pass",
            met=ratio <= 1.5,
            note=(
                f"float64 accumulation; max error against a float64 reference {err:.1e}; "
                f"converting every client tensor to float64 alone (torch's copy_, a slice at "
                f"a time, nothing summed) takes {t['conversion'].median * 1e3:.1f} ms = "
                f"{t['conversion'].median / t['float32 pass'].median:.2f}× the float32 pass"
            ),
            cpu_ratio=cpu_ratio(t["fedavg"], t["float32 pass"]),
        )
    ]


def partition_rows(per_round: dict[int, float]) -> list[Row]:
    from somatize.torch import federated as fl

    labels = torch.randint(0, 10, (100_000,), generator=torch.Generator().manual_seed(0))
    t = interleave(
        {
            "dirichlet": per_call(lambda: fl.dirichlet(labels, clients=1000, alpha=0.5), 1),
            "sample": per_call(lambda: fl.sample(1000, fraction=0.1, round=7), 100),
        },
        trials=3,
    )
    cost = t["dirichlet"].median + t["sample"].median
    base = per_round[max(per_round)]
    return [
        Row(
            "federated",
            "Dirichlet(0.5) partition of 100k examples × 1,000 clients, and one round's sample",
            cost * 1e3,
            "ms",
            baseline=f"one round of {max(per_round)} clients on 2 workers",
            baseline_value=base * 1e3,
            ratio=cost / base,
            target="negligible (≤ 0.1× a round)",
            met=cost / base <= 0.1,
            note=f"sample alone {t['sample'].median * 1e6:.0f} µs",
        )
    ]
