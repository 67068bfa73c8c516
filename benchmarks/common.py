"""The benchmark harness: interleaved trials, warm-up, medians, ratios against a baseline.

Every figure a benchmark reports is measured in the same run as its baseline:
the candidates of a comparison are timed in turn (A B C A B C ...) after a
warm-up, so drift in the machine's load hits all of them alike; the median of the
trials is reported with its min–max. ``per_call`` reads ``time.process_time`` beside
the wall clock, so a loaded machine (other processes taking the cores) shows as wall
time without CPU time instead of hiding or inventing a regression; the garbage
collector runs before each trial, outside the timing, so one trial does not pay for
another's garbage.
"""

from __future__ import annotations

import gc
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

    cpu: Timing | None = None  # process_time over the same trials, where it was read

    def scaled(self, factor: float) -> Timing:
        cpu = self.cpu.scaled(factor) if self.cpu is not None else None
        return Timing(self.median * factor, self.min * factor, self.max * factor, self.trials, cpu)


class Sample(float):
    """Wall seconds per operation, with the CPU seconds (``process_time``) beside them."""

    cpu: float

    def __new__(cls, wall: float, cpu: float) -> Sample:
        s = super().__new__(cls, wall)
        s.cpu = cpu
        return s

    def __reduce__(self) -> tuple[type[Sample], tuple[float, float]]:
        # (a Row holding one is copied by asdict: float's own reduce would drop the cpu)
        return Sample, (float(self), self.cpu)


def _timing(s: list[float]) -> Timing:
    return Timing(statistics.median(s), min(s), max(s), len(s))


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
            gc.collect()
            samples[name].append(fn())
    out = {}
    for name, s in samples.items():
        t = _timing(s)
        if all(isinstance(v, Sample) for v in s):
            t.cpu = _timing([v.cpu for v in s])  # type: ignore[attr-defined]
        out[name] = t
    return out


def per_call(fn: Callable[[], Any], number: int) -> Callable[[], float]:
    """A candidate timing ``number`` calls of ``fn``; returns seconds per call (a ``Sample``:
    wall time, with CPU time as ``.cpu``)."""

    def run() -> float:
        cpu, start = time.process_time(), time.perf_counter()
        for _ in range(number):
            fn()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return Sample(wall / number, cpu / number)

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
    cpu_ratio: float | None = None  # the same ratio in process_time, where both sides had it
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


def cpu_ratio(a: Timing, b: Timing) -> float | None:
    """The ratio of two timings' median CPU times, where both were read."""
    if a.cpu is None or b.cpu is None or not b.cpu.median:
        return None
    return a.cpu.median / b.cpu.median
