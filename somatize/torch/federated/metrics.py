"""Metrics across clients: example-weighted means, as Flower's ``weighted_loss_avg`` does."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import AggregationError
from .aggregation import _failed
from .clients import ClientFailure

__all__ = ["weighted_metrics"]


def _pair(i: int, r: Any) -> tuple[float, Mapping[str, Any]]:
    if isinstance(r, tuple) and len(r) == 2:
        n, metrics = r
    elif hasattr(r, "metrics") and hasattr(r, "num_examples"):
        n, metrics = r.num_examples, (r.metrics[-1] if r.metrics else {})
    elif isinstance(r, ClientFailure):
        raise _failed(i, r)
    else:
        raise AggregationError(
            f"client {i} is a {type(r).__qualname__}; give TrainResults or "
            "(num_examples, {metric: value}) pairs"
        )
    if not isinstance(metrics, Mapping):
        raise AggregationError(
            f"client {i}: metrics must be a dict, not {type(metrics).__qualname__}"
        )
    n = float(n)
    if not (n >= 0 and math.isfinite(n)):
        raise AggregationError(f"client {i} has {n} examples; counts must be finite and ≥ 0")
    return n, metrics


def weighted_metrics(results: Sequence[Any]) -> dict[str, float]:
    """The example-weighted mean of every metric the clients report.

    Args:
        results: ``TrainResult``s (their last evaluation, weighted by ``num_examples``)
            or ``(num_examples, {"val_loss": ..., ...})`` pairs — e.g. each client's own
            evaluation on its local test set, weighted by that set's size.

    Returns:
        ``{metric: mean}``; a metric some clients lack is averaged over those that report
        it. ``step`` and ``epoch`` are left out.

    Example:
        >>> weighted_metrics([(10, {"loss": 1.0}), (30, {"loss": 3.0})])
        {'loss': 2.5}
    """
    if isinstance(results, Mapping) or not isinstance(results, Sequence) or not results:
        raise AggregationError("weighted_metrics takes a non-empty list of client results")
    sums: dict[str, float] = {}
    totals: dict[str, float] = {}
    for i, r in enumerate(results):
        n, metrics = _pair(i, r)
        for k, v in metrics.items():
            if k in ("step", "epoch"):
                continue
            value = float(v)
            if math.isnan(value):
                raise AggregationError(
                    f"client {i}'s {k!r} is NaN; drop that client or fix its evaluation"
                )
            sums[k] = sums.get(k, 0.0) + n * value
            totals[k] = totals.get(k, 0.0) + n
    if not sums:  # e.g. Trainers fitted without val=: their TrainResults hold no evaluation
        raise AggregationError(
            f"none of the {len(results)} clients reports a metric, so there is nothing to "
            "average: a TrainResult holds metrics only when its Trainer evaluated — pass "
            "val= data (and metrics=) to each client's trainer.fit(g, data, val=...), or give "
            "(num_examples, {metric: value}) pairs from each client's own evaluation"
        )
    out = {}
    for k, s in sums.items():
        if totals[k] <= 0:
            raise AggregationError(f"no client that reports {k!r} has any examples")
        out[k] = s / totals[k]
    return out
