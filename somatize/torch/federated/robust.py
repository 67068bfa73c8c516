"""Byzantine-robust aggregation: median, trimmed mean, Krum, multi-Krum, Bulyan (norm
clipping, which bounds each update before any rule, is ``clipping.py``).

All of them validate exactly as ``fedavg`` does (names, shapes, dtypes, NaN/inf) and
are unweighted unless said otherwise: a client that lies about its updates can lie
about its ``num_examples`` too. Each works on client *states*; distances and
coordinate-wise statistics are the same on states as on updates (the global state
subtracted from each), so no global state is needed.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from ...errors import AggregationError
from ...stack import outside
from .aggregation import (
    Aggregate,
    IntPolicy,
    State,
    _integer,
    _prepare,
    _raw_weights,
    fedavg,
)
from .keys import Exclude
from .sampling import _int

__all__ = ["bulyan", "fedmedian", "krum", "multi_krum", "trimmed_mean"]

NonFinite = Literal["raise", "skip"]


def _coordinatewise(
    results: Sequence[Any],
    int_buffers: IntPolicy,
    nonfinite: str,
    reduce: Callable[[torch.Tensor], torch.Tensor],
    exclude: Exclude,
) -> Aggregate:
    states, keep, local = _prepare(results, nonfinite, int_buffers, exclude)
    out = Aggregate()
    with torch.no_grad():
        for k, ref in states[0].items():
            tensors = [states[i][k] for i in keep]
            if not ref.is_floating_point():
                out[k] = _integer(k, tensors, int_buffers, keep)
                continue
            stacked = torch.stack([t.to(torch.float64) for t in tensors])  # (clients, *shape)
            out[k] = reduce(stacked.sort(dim=0).values).to(ref.dtype)
    n = len(keep)
    out.weights, out.skipped = (1.0 / n,) * n, tuple(sorted(set(range(len(states))) - set(keep)))
    out.selected, out.excluded = tuple(keep), tuple(sorted(local))
    return out


def fedmedian(
    results: Sequence[Any],
    *,
    int_buffers: IntPolicy = None,
    nonfinite: NonFinite = "raise",
    exclude: Exclude = None,
) -> Aggregate:
    """The coordinate-wise median of client states (robust to a minority of bad clients).

    With an even number of clients, the mean of the two middle values. Unweighted.
    ``exclude=`` keeps keys local (not aggregated, left out of the result), as in ``fedavg``.

    Example:
        >>> s = [{"w": torch.tensor([v])} for v in (1.0, 2.0, 1e6)]
        >>> fedmedian(s)["w"]
        tensor([2.])
    """

    def median(sorted_: torch.Tensor) -> torch.Tensor:
        n = sorted_.shape[0]
        return (sorted_[(n - 1) // 2] + sorted_[n // 2]) / 2

    return _coordinatewise(results, int_buffers, nonfinite, median, exclude)


def trimmed_mean(
    results: Sequence[Any],
    beta: float,
    *,
    int_buffers: IntPolicy = None,
    nonfinite: NonFinite = "raise",
    exclude: Exclude = None,
) -> Aggregate:
    """The coordinate-wise mean after dropping the ``beta`` fraction of largest and smallest values.

    Args:
        beta: the fraction trimmed at each end, in [0, 0.5) (Flower's range);
            ``int(beta * n)`` values each, as Flower and ``scipy.stats.trim_mean`` cut. A
            ``beta`` > 0 that trims nothing (``beta * n < 1``) warns (a ``UserWarning``).
        exclude: keys kept local (not aggregated, left out of the result), as in ``fedavg``.

    Example:
        >>> s = [{"w": torch.tensor([v])} for v in (1.0, 2.0, 3.0, 1e6)]
        >>> trimmed_mean(s, 0.25)["w"]
        tensor([2.5000])
    """
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 <= beta < 0.5:
        raise ValueError(f"beta must be in [0, 0.5), not {beta!r}; for beta → 0.5 use fedmedian")

    warned = False

    def trim(sorted_: torch.Tensor) -> torch.Tensor:
        nonlocal warned
        n = sorted_.shape[0]
        cut = int(beta * n)
        if beta > 0 and cut == 0 and not warned:  # a setting that would do nothing, silently
            warned = True
            warnings.warn(
                f"trimmed_mean(beta={beta!r}) over {n} clients trims int({beta!r} × {n}) = 0 "
                f"values at each end: this is the plain unweighted mean, not robust to any "
                f"attacker; use beta ≥ 1/{n} = {1 / n:.3g} to trim one value at each end, or "
                "sample more clients per round",
                UserWarning,
                stacklevel=outside(),
            )
        return sorted_[cut : n - cut].mean(dim=0)

    return _coordinatewise(results, int_buffers, nonfinite, trim, exclude)


def _flat(states: list[State]) -> torch.Tensor:
    """Every floating tensor of each client, flattened in float64: (clients, params)."""
    keys = [k for k, t in states[0].items() if t.is_floating_point()]
    if not keys:
        kinds = sorted({str(t.dtype) for t in states[0].values()}) or ["no tensors"]
        raise AggregationError(
            f"no floating-point tensors to measure distances between: the clients' states "
            f"hold {', '.join(kinds)}; krum and bulyan compare weights — pass the clients' "
            "float state dicts, or average these with fedavg or fedmedian"
        )
    return torch.stack(
        [torch.cat([s[k].detach().reshape(-1).to(torch.float64) for k in keys]) for s in states]
    )


def _drop(rule: str) -> str:
    """What to do about a NaN/inf update under a rule that takes no ``nonfinite=``."""
    return (
        f"{rule} takes no nonfinite= (one NaN makes every distance meaningless): drop that "
        "client's result before calling it — or use fl.fedmedian or fl.trimmed_mean, whose "
        "nonfinite='skip' leaves such clients out and reports them"
    )


def _check_attackers(name: str, n: int, attackers: int, times: int) -> int:
    """``attackers`` as an int (numpy's too), and enough clients for it: n ≥ times·f + 3."""
    attackers = _int("attackers", attackers, 0, "a non-negative int")
    needed, rule = times * attackers + 3, f"n ≥ {times}f + 3"
    if n < needed:
        raise AggregationError(
            f"{name} with attackers={attackers} needs at least {needed} clients ({rule}), but "
            f"got {n}; sample more clients per round or assume fewer attackers"
        )
    return attackers


def _krum_scores(flat: torch.Tensor, attackers: int) -> torch.Tensor:
    """Each client's Krum score: the summed squared distances to its n − f − 2 nearest others."""
    n = flat.shape[0]
    d = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist") ** 2  # (n, n)
    closest = max(1, n - attackers - 2)
    d.fill_diagonal_(math.inf)
    return d.topk(min(closest, n - 1), dim=1, largest=False).values.sum(dim=1)


def _krum_order(states: list[State], attackers: int) -> list[int]:
    scores = _krum_scores(_flat(states), attackers)
    return sorted(range(len(states)), key=lambda i: (float(scores[i]), i))


def multi_krum(
    results: Sequence[Any],
    attackers: int,
    keep: int,
    *,
    weights: str | Sequence[float] = "uniform",
    int_buffers: IntPolicy = None,
    exclude: Exclude = None,
) -> Aggregate:
    """The mean of the ``keep`` clients with the best Krum scores (Blanchard et al. 2017).

    A client's score is the sum of squared distances to its n − f − 2 nearest
    neighbours (f = ``attackers``); updates far from the crowd score badly.

    Args:
        attackers: the number f of Byzantine clients assumed; needs n ≥ 2f + 3.
        keep: how many of the best-scoring clients to average (1 is Krum).
        weights: passed to ``fedavg`` over the kept clients (``"uniform"`` by default:
            a Byzantine client can claim any ``num_examples``); every client's is checked
            as ``fedavg`` checks them (a set is refused, a negative or NaN one named by
            the client's index), picked or not.
        exclude: keys kept local, as in ``fedavg``: left out of the distances too.

    Returns:
        An ``Aggregate`` whose ``selected`` lists the kept clients, best first.

    Example:
        >>> s = [{"w": torch.tensor([v])} for v in (1.0, 1.1, 0.9, 1.2, 50.0)]
        >>> multi_krum(s, attackers=1, keep=2).selected
        (0, 1)
    """
    return _multi_krum(results, attackers, keep, weights, int_buffers, exclude, "multi_krum")


def _multi_krum(
    results: Sequence[Any],
    attackers: int,
    keep: int,
    weights: str | Sequence[float],
    int_buffers: IntPolicy,
    exclude: Exclude,
    rule: str,
) -> Aggregate:
    # NaN/inf: every distance meaningless
    states, _, local = _prepare(results, "raise", int_buffers, exclude, _drop(rule))
    n = len(states)
    attackers = _check_attackers("Krum", n, attackers, 2)
    keep = _int("keep", keep, 1, f"an int in [1, {n}] (the number of clients)")
    if keep > n:
        raise ValueError(f"keep must be an int in [1, {n}] (the number of clients), not {keep!r}")
    raw = _raw_weights(results, weights)  # every client's, checked as fedavg checks them
    with torch.no_grad():
        chosen = _krum_order(states, attackers)[:keep]
    picked = [results[i] for i in chosen]
    w = [raw[i] for i in chosen]
    if not sum(w) > 0:
        raise AggregationError(
            f"the clients {rule} kept, {chosen}, have weights summing to {sum(w)} (none has "
            "examples); give them positive weights, or pass weights='uniform' (the default)"
        )
    # the keys resolved against every client, not the picked ones (who may lack them)
    out = fedavg(picked, weights=w, int_buffers=int_buffers, exclude=local.__contains__)
    out.selected, out.excluded = tuple(chosen), tuple(sorted(local))
    return out


def krum(
    results: Sequence[Any],
    attackers: int,
    *,
    int_buffers: IntPolicy = None,
    exclude: Exclude = None,
) -> Aggregate:
    """The one client whose update is closest to its n − f − 2 nearest others (Krum).

    ``exclude=`` keeps keys local (left out of the distances and the result), as in ``fedavg``.

    Example:
        >>> s = [{"w": torch.tensor([v])} for v in (1.0, 1.1, 0.9, 1.2, 50.0)]
        >>> krum(s, attackers=1)["w"]
        tensor([1.])
    """
    return _multi_krum(results, attackers, 1, "uniform", int_buffers, exclude, "krum")


def bulyan(
    results: Sequence[Any],
    attackers: int,
    *,
    int_buffers: IntPolicy = None,
    exclude: Exclude = None,
) -> Aggregate:
    """Bulyan (El Mhamdi et al. 2018): Krum picks θ = n − 2f clients one at a time, then
    each coordinate is the mean of the β = θ − 2f values closest to their median.

    Args:
        attackers: the number f of Byzantine clients assumed; needs n ≥ 4f + 3.
        exclude: keys kept local, as in ``fedavg``: left out of the distances too.

    Example:
        >>> s = [{"w": torch.tensor([v])} for v in (1.0, 1.1, 0.9, 1.2, 1.05, 1.15, 50.0)]
        >>> round(bulyan(s, attackers=1)["w"].item(), 4)
        1.15
    """
    states, _, local = _prepare(results, "raise", int_buffers, exclude, _drop("bulyan"))
    n = len(states)
    attackers = _check_attackers("Bulyan", n, attackers, 4)
    theta, beta = n - 2 * attackers, n - 4 * attackers
    with torch.no_grad():
        flat = _flat(states)
        left, chosen = list(range(n)), []
        for _ in range(theta):  # Krum again on the clients not chosen yet
            scores = _krum_scores(flat[left], attackers)
            best = left[min(range(len(left)), key=lambda j: (float(scores[j]), j))]
            chosen.append(best)
            left.remove(best)
        out = Aggregate()
        for k, ref in states[0].items():
            tensors = [states[i][k] for i in chosen]
            if not ref.is_floating_point():
                out[k] = _integer(k, tensors, int_buffers, chosen)
                continue
            stacked = torch.stack([t.to(torch.float64) for t in tensors])  # (θ, *shape)
            median = stacked.median(dim=0, keepdim=True).values
            if theta % 2 == 0:  # the mean of the middle two, as fedmedian
                srt = stacked.sort(dim=0).values
                median = (srt[theta // 2 - 1] + srt[theta // 2]).unsqueeze(0) / 2
            nearest = (stacked - median).abs().topk(beta, dim=0, largest=False).indices
            out[k] = stacked.gather(0, nearest).mean(dim=0).to(ref.dtype)
    out.weights, out.selected = (1.0 / theta,) * theta, tuple(chosen)
    out.excluded = tuple(sorted(local))
    return out
