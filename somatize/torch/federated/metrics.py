"""Metrics across clients: example-weighted means, as Flower's ``weighted_loss_avg`` does —
each metric weighted by the examples it was computed over."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import AggregationError
from ...stack import outside
from .clients import ClientFailure

__all__ = ["weighted_metrics"]

Count = Callable[[str], "float | None"]  # a metric's name -> its examples (None: not known)


def _pair(i: int, r: Any) -> tuple[Count, Mapping[str, Any]]:
    if isinstance(r, tuple) and len(r) == 2:
        n, metrics = r
        n = _examples(i, n)
        count: Count = lambda _: n  # noqa: E731
    elif hasattr(r, "metrics") and hasattr(r, "num_examples"):
        metrics = r.metrics[-1] if r.metrics else {}
        count = _evaluated(i, getattr(r, "val_examples", None) or {})
    elif isinstance(r, ClientFailure):
        raise r._refusal(i)
    else:
        raise AggregationError(
            f"client {i} is a {type(r).__qualname__}; give TrainResults or "
            "(num_examples, {metric: value}) pairs"
        )
    if not isinstance(metrics, Mapping):
        raise AggregationError(
            f"client {i}: metrics must be a dict, not {type(metrics).__qualname__} "
            f"({metrics!r:.40}); give (num_examples, {{'val_acc': 0.9}}) pairs or TrainResults"
        )
    return count, metrics


def _examples(i: int, n: Any) -> float:
    count = float(n)
    if not (count >= 0 and math.isfinite(count)):
        raise AggregationError(f"client {i} has {count} examples; counts must be finite and ≥ 0")
    return count


def _evaluated(i: int, counts: Mapping[str, int]) -> Count:
    """A TrainResult's metric name -> the examples its validation set's last evaluation
    averaged over (``TrainResult.val_examples``, by the prefix of the set's metrics: the
    longest that fits, as ``val_a_b_`` before ``val_a_``)."""
    prefixes = sorted(counts, key=len, reverse=True)

    def count(name: str) -> float | None:
        p = next((p for p in prefixes if name.startswith(p)), None)
        return None if p is None else _examples(i, counts[p])

    return count


def weighted_metrics(results: Sequence[Any]) -> dict[str, float]:
    """The example-weighted mean of every metric the clients report.

    Args:
        results: ``TrainResult``s — their last evaluation, each metric weighted by the
            examples its validation set held (``TrainResult.val_examples``), as Flower
            weighs evaluations by their size — or ``(num_examples, {"val_loss": ...})``
            pairs: e.g. each client's own evaluation on its local test set, weighted by
            that set's size.

    Returns:
        ``{metric: mean}``; a metric some clients lack is averaged over those that report
        it. ``step`` and ``epoch`` are left out. With the clients' evaluation sizes as
        weights, a mean metric (loss, accuracy) is the one of all their examples pooled.

    Warns:
        UserWarning: a ``TrainResult`` that does not say how many examples a metric was
            computed over (made by hand, or before results recorded it):
            that metric is weighted by its ``num_examples``, the training-set size.

    Example:
        >>> weighted_metrics([(10, {"loss": 1.0}), (30, {"loss": 3.0})])
        {'loss': 2.5}
    """
    if isinstance(results, Mapping) or not isinstance(results, Sequence) or not results:
        raise AggregationError("weighted_metrics takes a non-empty list of client results")
    sums: dict[str, float] = {}
    totals: dict[str, float] = {}
    unsized: dict[str, list[int]] = {}  # metric -> clients weighted by training-set size
    for i, r in enumerate(results):
        count, metrics = _pair(i, r)
        for k, v in metrics.items():
            if k in ("step", "epoch"):
                continue
            value = float(v)
            if math.isnan(value):
                raise AggregationError(
                    f"client {i}'s {k!r} is NaN; drop that client or fix its evaluation"
                )
            n = count(k)
            if n is None:
                n = _examples(i, r.num_examples)
                unsized.setdefault(k, []).append(i)
            sums[k] = sums.get(k, 0.0) + n * value
            totals[k] = totals.get(k, 0.0) + n
    if not sums:  # e.g. Trainers fitted without val=: their TrainResults hold no evaluation
        raise AggregationError(
            f"none of the {len(results)} clients reports a metric, so there is nothing to "
            "average: a TrainResult holds metrics only when its Trainer evaluated — pass "
            "val= data (and metrics=) to each client's trainer.fit(g, data, val=...), or give "
            "(num_examples, {metric: value}) pairs from each client's own evaluation"
        )
    if unsized:
        k, clients = next(iter(unsized.items()))
        more = f" (and {len(unsized) - 1} more metrics)" if len(unsized) > 1 else ""
        warnings.warn(
            f"clients {clients[:5]} do not say how many examples their {k!r}{more} was "
            "computed over (TrainResult.val_examples): weighted by num_examples, their "
            "training-set size, instead; pass (evaluated examples, {metric: value}) pairs "
            "to weigh each by its evaluation's size",
            UserWarning,
            stacklevel=outside(),
        )
    out = {}
    for k, s in sums.items():
        if totals[k] <= 0:
            raise AggregationError(
                f"no client that reports {k!r} has any examples, so its weighted mean has no "
                "weight; give each such client its number of evaluated examples (above 0)"
            )
        out[k] = s / totals[k]
    return out
