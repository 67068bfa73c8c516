"""Which clients take part in a round: a fraction or a count, deterministic in (seed, round)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["sample"]


def sample(
    clients: int,
    *,
    fraction: float | None = None,
    count: int | None = None,
    round: int,
    seed: int = 0,
    weights: Sequence[float] | None = None,
) -> list[int]:
    """The clients of round ``round``: sorted indices, drawn without replacement.

    The draw depends only on ``(seed, round)``, so a resumed loop samples the same
    clients as an uninterrupted one, whatever ran before.

    Args:
        clients: how many clients there are.
        fraction: the share to take, ``max(1, floor(fraction * clients))`` of them
            (McMahan et al.'s C); or give ``count``.
        count: how many to take.
        round: the round number.
        seed: the campaign's seed.
        weights: optional sampling weights, one per client (e.g. client sizes): a client
            is drawn with probability proportional to its weight.

    Example:
        >>> sample(100, fraction=0.1, round=0, seed=0) == sample(100, fraction=0.1, round=0, seed=0)
        True
        >>> len(sample(100, fraction=0.1, round=3, seed=0))
        10
    """
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise ValueError(f"clients must be a positive int (how many there are), not {clients!r}")
    if (fraction is None) == (count is None):
        raise ValueError("give exactly one of fraction= (a share of the clients) or count=")
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], not {fraction!r}")
        count = max(1, math.floor(_round9(fraction * clients)))
    assert count is not None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= clients:
        raise ValueError(f"count must be an int in [1, {clients}], not {count!r}")
    if isinstance(round, bool) or not isinstance(round, int) or round < 0:
        raise ValueError(f"round must be a non-negative int, not {round!r}")
    rng = np.random.default_rng([seed, round])
    p = None
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (clients,) or not np.isfinite(w).all() or (w < 0).any():
            raise ValueError(
                f"weights must be {clients} finite non-negative numbers (one per client)"
            )
        if np.count_nonzero(w) < count:
            raise ValueError(
                f"only {np.count_nonzero(w)} clients have a positive weight; cannot draw {count}"
            )
        p = w / w.sum()
    return sorted(int(c) for c in rng.choice(clients, size=count, replace=False, p=p))


def _round9(x: float) -> float:
    """``x`` rounded to 9 decimals, so 0.29 * 100 counts as 29, not 28.999999999999996."""
    return float(f"{x:.9f}")
