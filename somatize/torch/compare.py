"""``compare``: configurations of a sweep side by side, each summarised over its seeds.

A sweep is a dict of configuration -> its runs (one per seed), made by plain Python::

    runs = {lr: [train(lr, seed) for seed in range(3)] for lr in (1e-3, 1e-2, 1e-1)}
    print(st.compare(runs, "val_acc"))

Each configuration is a ``summarize`` of its runs; the best configuration is the one
with the best mean (not the one with the single best run, which a lucky seed decides).
Beside each mean, the difference from the best with its standard error and its 95%
confidence interval — over the runs as independent samples (Welch's), or, with
``paired=True`` where every configuration ran the same seeds in the same order, over each
seed's difference (the seed's luck cancels) — and a line saying when the best is not told
apart from the runner-up (0 inside that interval). The interval is Student's t over the
runs' degrees of freedom (``intervals.py``): with five seeds ±2.78 standard errors, not the
±2 that would claim 95% of a few runs where it holds only about 88%.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..stack import outside
from .campaign import Summary, summarize
from .intervals import t_quantile, welch_df
from .options import improves

__all__ = ["Comparison", "Difference", "compare"]


@dataclass(frozen=True)
class Difference:
    """A configuration's metric minus the best configuration's.

    Attributes:
        mean: the difference of the means (paired: the mean of each seed's difference).
        se: its standard error — paired, the standard deviation of the seeds' differences
            over √n; else √(s²/n + s_best²/n_best) — NaN with too few runs to tell.
        n: the runs (paired: the seeds) it is over.
        ahead: paired, the seeds on which this configuration did better than the best;
            None unpaired.
        low, high: its 95% confidence interval, ``mean`` ± t·``se`` with Student's t over
            n - 1 degrees of freedom (paired) or Welch's (unpaired); NaN where ``se`` is.
    """

    mean: float
    se: float
    n: int
    ahead: int | None = None
    low: float = math.nan
    high: float = math.nan


@dataclass(frozen=True)
class Comparison:
    """One metric over the configurations of a sweep. ``str()`` gives a table.

    Attributes:
        metric: the metric compared.
        summaries: configuration -> the ``Summary`` of its runs, in the order given.
        best: the configuration with the best mean (by ``mode``).
        mode: ``"min"`` or ``"max"`` — which way is better.
        vs_best: configuration -> its ``Difference`` from the best (the best's own: 0).
        paired: whether the differences are over seeds, run for run (``paired=True``).
    """

    metric: str
    summaries: Mapping[Hashable, Summary]
    best: Hashable
    mode: str
    vs_best: Mapping[Hashable, Difference] = field(default_factory=dict)
    paired: bool = False

    def distinct(self, config: Hashable) -> bool | None:
        """Whether ``config``'s difference from the best is told apart from 0: 0 lies outside
        its 95% confidence interval (``Difference.low``, ``high``) — a two-sided t-test at
        5%. None: too few runs to tell."""
        d = self.vs_best[config]
        if math.isnan(d.se):
            return None
        return not d.low <= 0 <= d.high

    def ranked(self) -> list[Hashable]:
        """The configurations, best mean first."""
        return sorted(
            self.summaries, key=lambda c: self.summaries[c].mean, reverse=self.mode == "max"
        )

    def __str__(self) -> str:
        names = {c: _label(c) for c in self.summaries}
        width = max(len("config"), *(len(n) for n in names.values()))
        how = (
            "paired over seeds, ± its standard error, 95% CI"
            if self.paired
            else "± its standard error, 95% CI"
        )
        rows = [f"{'config':<{width}}  {self.metric} (mean ± std over runs)  Δ vs best ({how})"]
        for c in self.ranked():
            s, d = self.summaries[c], self.vs_best.get(c)
            if c == self.best or d is None:
                delta = "<- best" if c == self.best else ""
            else:
                delta = f"{d.mean:+.4f}"
                if not math.isnan(d.se):
                    delta += f" ± {d.se:.4f} [{d.low:+.4f}, {d.high:+.4f}]"
                delta += f" (better on {d.ahead}/{d.n} seeds)" if d.ahead is not None else ""
            spread = f"± {s.std:.4f}" if s.n > 1 else "(one run)"  # (not ± 0: unknown)
            rows.append(
                f"{names[c]:<{width}}  {s.mean:.4f} {spread}  (n={s.n}, "
                f"min {s.min:.4f}, max {s.max:.4f})  {delta}".rstrip()
            )
        ranked = self.ranked()
        if len(ranked) > 1 and self.vs_best:
            runner = ranked[1] if ranked[0] == self.best else ranked[0]
            told = self.distinct(runner)
            if told is None:
                rows.append(
                    f"(too few runs to tell {names[self.best]} from {names[runner]}: "
                    "a standard error needs two runs each, or two paired seeds)"
                )
            elif not told:
                more = "" if self.paired else ", or paired=True where the runs share seeds"
                rows.append(
                    f"({names[self.best]} is best by its mean, but the 95% confidence interval "
                    f"of {names[runner]}'s difference from it holds 0: these runs do not tell "
                    f"them apart — more seeds{more})"
                )
        return "\n".join(rows)


def compare(
    runs: Mapping[Hashable, Sequence[Any]],
    metric: str,
    *,
    mode: Literal["min", "max"] | None = None,
    nan: Literal["raise", "omit"] = "raise",
    paired: bool = False,
) -> Comparison:
    """Each configuration's runs summarised (``summarize``), the best configuration, and
    each one's difference from the best with its standard error and 95% confidence interval.

    Args:
        runs: configuration (any hashable: a number, a string, a tuple, a frozen
            dataclass) -> its runs, ``TrainResult``s or numbers (one per seed). Compare
            runs that stop early at their best: ``{c: [r.best for r in rs] ...}``.
        metric: e.g. ``"val_acc"``.
        mode: which way is better; by default what the name says (as ``summarize``).
        nan: as ``summarize``: a diverged run raises, or ``"omit"`` leaves it out.
        paired: every configuration ran the same seeds, in the same order: the differences
            are taken seed by seed (a seed that favours every configuration cancels),
            with the seeds each did better on. Else the runs are independent samples.

    Raises:
        TypeError: ``runs`` is not a mapping of configuration to runs.
        ValueError: no configurations, or a configuration without runs (naming it); with
            ``paired=True``, configurations with different numbers of runs (naming them);
            and what ``summarize`` raises, naming the configuration.

    Example:
        >>> c = compare({"lr=0.1": [0.90, 0.92], "lr=0.01": [0.95, 0.93]}, "val_acc")
        >>> c.best, round(c.summaries[c.best].mean, 2)
        ('lr=0.01', 0.94)
    """
    if not isinstance(runs, Mapping):
        raise TypeError(
            f"compare({metric!r}) takes a dict of configuration -> its runs, e.g. "
            f"{{lr: [train(lr, seed) for seed in seeds] for lr in lrs}}, not a "
            f"{type(runs).__qualname__}; for one list of runs, use summarize"
        )
    if not runs:
        raise ValueError(
            f"no configurations to compare for {metric!r}: the dict is empty; pass "
            "{config: [result, ...]} with at least one configuration"
        )
    if mode is None:
        mode = improves(metric) or "max"
        if improves(metric) is None and len(runs) > 1:
            warnings.warn(
                f"compare({metric!r}): the name does not say which way it improves, so best "
                "is the configuration with the largest mean; pass mode='min' if lower is better",
                UserWarning,
                stacklevel=outside(),
            )
    summaries: dict[Hashable, Summary] = {}
    for config, results in runs.items():
        if isinstance(results, (str, bytes)) or not isinstance(results, Sequence):
            raise TypeError(
                f"compare({metric!r}): configuration {config!r} maps to a "
                f"{type(results).__qualname__}, not a list of its runs; write "
                f"{{{config!r}: [result, ...]}} (one result per seed)"
            )
        if not results:
            raise ValueError(
                f"compare({metric!r}): configuration {config!r} has no runs; give it at least "
                "one result (one per seed), or leave it out"
            )
        try:
            summaries[config] = summarize(results, metric, mode=mode, nan=nan)
        except (TypeError, ValueError) as e:
            raise type(e)(f"configuration {config!r}: {e}") from e
    if paired:
        counts = {c: len(s.values) for c, s in summaries.items()}
        if len(set(counts.values())) > 1:
            said = ", ".join(f"{c!r}: {n}" for c, n in counts.items())
            raise ValueError(
                f"compare({metric!r}, paired=True) pairs the runs seed by seed, but the "
                f"configurations have different numbers of runs ({said}); give each the "
                "same seeds in the same order, or pass paired=False"
            )
    pick = min if mode == "min" else max
    best = pick(summaries, key=lambda c: summaries[c].mean)
    vs_best = {c: _difference(s, summaries[best], paired) for c, s in summaries.items()}
    return Comparison(metric, summaries, best, mode, vs_best, paired)


def _difference(s: Summary, best: Summary, paired: bool) -> Difference:
    """``s`` minus ``best``: seed by seed (NaN pairs left out), or of independent means;
    with its 95% interval by Student's t (paired: n - 1 degrees of freedom; else Welch's)."""
    if paired:
        d = [a - b for a, b in zip(s.values, best.values) if not (math.isnan(a) or math.isnan(b))]
        if not d:
            return Difference(math.nan, math.nan, 0, 0)
        se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan
        better = sum(x < 0 if best.mode == "min" else x > 0 for x in d)
        mean = statistics.fmean(d)
        return Difference(mean, se, len(d), better, *_interval(mean, se, len(d) - 1))
    se = math.sqrt(s.std**2 / s.n + best.std**2 / best.n) if s.n > 1 and best.n > 1 else math.nan
    mean = s.mean - best.mean
    df = welch_df(s.std, s.n, best.std, best.n) if s.n > 1 and best.n > 1 else math.nan
    return Difference(mean, se, s.n, None, *_interval(mean, se, df))


def _interval(mean: float, se: float, df: float) -> tuple[float, float]:
    """``mean`` ± the 97.5% quantile of Student's t over ``df`` times ``se`` (no spread at
    all, ``se`` 0: the mean itself; NaN where ``se`` is)."""
    if math.isnan(se):
        return math.nan, math.nan
    half = 0.0 if se == 0 else t_quantile(0.975, df) * se
    return mean - half, mean + half


def _label(config: Hashable) -> str:
    """A configuration as the table shows it: floats to 4 significant digits (a sampled
    learning rate, 0.002015); name-value pairs (``tuple(sorted(trial.params.items()))``)
    as ``lr=0.002015, width=64``."""
    if isinstance(config, str):
        return config
    if isinstance(config, float):
        return f"{config:.4g}"
    if isinstance(config, tuple):
        if config and all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in config
        ):
            return ", ".join(f"{k}={_label(v)}" for k, v in config)
        inner = ", ".join(_label(v) for v in config)
        return f"({inner},)" if len(config) == 1 else f"({inner})"
    return repr(config)
