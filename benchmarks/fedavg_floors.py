"""The baselines fedavg is measured against (``bench_level3``, ``bench_federated``)."""

from __future__ import annotations

from typing import Any

import torch


def float32_pass(states: list[dict[str, Any]], weights: list[float]) -> None:
    """The cheapest weighted mean: one float32 accumulation over every client tensor."""
    total = sum(weights)
    for k in states[0]:
        acc = torch.zeros_like(states[0][k])
        for s, w in zip(states, weights):
            acc.add_(s[k], alpha=w / total)


def conversion_pass(states: list[dict[str, Any]]) -> None:
    """Only the float32 -> float64 conversion fedavg needs: every client tensor converted, a
    cache-sized slice at a time, into one float64 buffer, nothing summed — the floor of any
    float64 sum built from torch's CPU kernels, which have no fused convert-and-accumulate."""
    chunk = 1 << 18
    buf = torch.empty(chunk, dtype=torch.float64)
    for k in states[0]:
        n = states[0][k].numel()
        for start in range(0, n, chunk):
            for s in states:
                piece = s[k].reshape(-1)[start : start + chunk]
                buf[: piece.numel()].copy_(piece)
