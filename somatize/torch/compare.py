"""``compare``: configurations of a sweep side by side, each summarised over its seeds.

A sweep is a dict of configuration -> its runs (one per seed), made by plain Python::

    runs = {lr: [train(lr, seed) for seed in range(3)] for lr in (1e-3, 1e-2, 1e-1)}
    print(st.compare(runs, "val_acc"))

Each configuration is a ``summarize`` of its runs; the best configuration is the one
with the best mean (not the one with the single best run, which a lucky seed decides).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..stack import outside
from .campaign import Summary, summarize
from .options import improves

__all__ = ["Comparison", "compare"]


@dataclass(frozen=True)
class Comparison:
    """One metric over the configurations of a sweep. ``str()`` gives a table.

    Attributes:
        metric: the metric compared.
        summaries: configuration -> the ``Summary`` of its runs, in the order given.
        best: the configuration with the best mean (by ``mode``).
        mode: ``"min"`` or ``"max"`` — which way is better.
    """

    metric: str
    summaries: Mapping[Hashable, Summary]
    best: Hashable
    mode: str

    def ranked(self) -> list[Hashable]:
        """The configurations, best mean first."""
        return sorted(
            self.summaries, key=lambda c: self.summaries[c].mean, reverse=self.mode == "max"
        )

    def __str__(self) -> str:
        names = {c: _label(c) for c in self.summaries}
        width = max(len("config"), *(len(n) for n in names.values()))
        rows = [f"{'config':<{width}}  {self.metric} (mean ± std over runs)"]
        for c in self.ranked():
            s = self.summaries[c]
            mark = "  <- best" if c == self.best else ""
            rows.append(
                f"{names[c]:<{width}}  {s.mean:.4f} ± {s.std:.4f}  (n={s.n}, "
                f"min {s.min:.4f}, max {s.max:.4f}){mark}"
            )
        return "\n".join(rows)


def compare(
    runs: Mapping[Hashable, Sequence[Any]],
    metric: str,
    *,
    mode: Literal["min", "max"] | None = None,
    nan: Literal["raise", "omit"] = "raise",
) -> Comparison:
    """Each configuration's runs summarised (``summarize``), and the best configuration.

    Args:
        runs: configuration (any hashable: a number, a string, a tuple, a frozen
            dataclass) -> its runs, ``TrainResult``s or numbers (one per seed). Compare
            runs that stop early at their best: ``{c: [r.best for r in rs] ...}``.
        metric: e.g. ``"val_acc"``.
        mode: which way is better; by default what the name says (as ``summarize``).
        nan: as ``summarize``: a diverged run raises, or ``"omit"`` leaves it out.

    Raises:
        TypeError: ``runs`` is not a mapping of configuration to runs.
        ValueError: no configurations, or a configuration without runs (naming it); and
            what ``summarize`` raises, naming the configuration.

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
    pick = min if mode == "min" else max
    best = pick(summaries, key=lambda c: summaries[c].mean)
    return Comparison(metric=metric, summaries=summaries, best=best, mode=mode)


def _label(config: Hashable) -> str:
    if isinstance(config, str):
        return config
    return repr(config)
