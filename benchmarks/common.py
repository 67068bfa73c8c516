"""The benchmark harness: interleaved trials, warm-up, medians, ratios against a baseline.

Every figure a benchmark reports is measured in the same run as its baseline:
the candidates of a comparison are timed in turn (A B C A B C ...) after a
warm-up, so drift in the machine's load hits all of them alike; the median of the
trials is reported with its min–max.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Timing:
    """Seconds per operation over the trials."""

    median: float
    min: float
    max: float
    trials: int

    def scaled(self, factor: float) -> Timing:
        return Timing(self.median * factor, self.min * factor, self.max * factor, self.trials)


def interleave(
    candidates: dict[str, Callable[[], float]], *, trials: int = 7, warmup: int = 1
) -> dict[str, Timing]:
    """Time each candidate ``trials`` times, in turn; each call returns seconds per operation."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    for _ in range(trials):
        for name, fn in candidates.items():
            samples[name].append(fn())
    return {
        name: Timing(statistics.median(s), min(s), max(s), len(s)) for name, s in samples.items()
    }


def per_call(fn: Callable[[], Any], number: int) -> Callable[[], float]:
    """A candidate timing ``number`` calls of ``fn``; returns seconds per call."""

    def run() -> float:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number

    return run


@dataclass
class Row:
    """One reported figure: a measurement, its baseline, their ratio and the target."""

    benchmark: str
    case: str
    value: float
    unit: str
    baseline: str = ""
    baseline_value: float | None = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    spread: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit == "µs":
        return f"{value:,.2f} µs" if value < 100 else f"{value:,.0f} µs"
    if unit == "ms":
        return f"{value:,.2f} ms"
    if unit == "x":
        return f"{value:.2f}×"
    if unit == "%":
        return f"{value:.0f}%"
    return f"{value:.4g}{(' ' + unit) if unit else ''}"


def spread(t: Timing, scale: float, unit: str) -> str:
    return f"{fmt(t.min * scale, unit)} – {fmt(t.max * scale, unit)}"
