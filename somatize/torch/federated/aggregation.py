"""``fedavg``: the weighted mean of client states, and the validation every aggregator shares.

Every aggregator matches tensors by *name*, accumulates in float64 and casts back
to each tensor's dtype, and validates first — each error names the client index
and the key. Integer buffers (BatchNorm's ``num_batches_tracked``) are counters,
not weights: averaging them as floats is wrong, so ``int_buffers`` says what to do.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from ...errors import AggregationError
from ...stack import outside
from .accumulate import _Scratch, _weighted_mean
from .clients import ClientFailure
from .keys import Exclude, _local, _wide, _without

__all__ = ["Aggregate", "fedavg"]

IntPolicy = Literal["max", "first", "error"] | None
State = Mapping[str, torch.Tensor]


class Aggregate(dict[str, torch.Tensor]):
    """The aggregated state (a plain name → tensor dict) and what went into it.

    Attributes:
        weights: the normalised weight of each client that was used.
        skipped: indices of clients left out for non-finite values (``nonfinite="skip"``).
        selected: indices of the clients that went into it (Krum and Bulyan choose some).
        excluded: the keys ``exclude=`` kept local, which it does not hold (FedBN).
    """

    weights: tuple[float, ...] = ()
    skipped: tuple[int, ...] = ()
    selected: tuple[int, ...] = ()
    excluded: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (``torch.save``, a pool's results, ``copy``) as the ``OrderedDict`` a
        ``state_dict()`` is, the attributes set on it as ``_metadata`` is on a state dict:
        ``torch.load``'s default ``weights_only=True`` builds only such types."""
        attrs = {
            "weights": self.weights,
            "skipped": self.skipped,
            "selected": self.selected,
            "excluded": self.excluded,
        }
        return OrderedDict, (), attrs, None, iter(self.items())


def _states(results: Sequence[Any]) -> list[State]:
    if isinstance(results, Mapping) or not isinstance(results, Sequence):
        one = " (one client's state dict? wrap it: [state])" if isinstance(results, Mapping) else ""
        raise TypeError(
            f"aggregate a list of TrainResults or state dicts, one per client, not a "
            f"{type(results).__qualname__}{one}; e.g. fedavg([r1, r2])"
        )
    if not results:
        raise AggregationError(
            "nothing to aggregate: the list of client results is empty; pass each client's "
            "result. If every client failed (map_clients(errors='return')) or was dropped, the "
            "round has nothing to average: keep the global state for that round, and step no "
            "server optimizer"
        )
    states = []
    for i, r in enumerate(results):
        s = getattr(r, "state", r)
        if not isinstance(s, Mapping):
            if isinstance(r, ClientFailure):  # (checked here: no cost on the way of a state)
                raise r._refusal(i)
            raise TypeError(
                f"client {i} is a {type(r).__qualname__} ({r!r:.40}), not a TrainResult or "
                "state dict; pass what each client's fit returned, or its .state"
            )
        states.append(s)
    return states


def _not_a_tensor(i: int, k: str, t: Any) -> AggregationError:
    return AggregationError(
        f"client {i}, key {k!r}: a {type(t).__qualname__} ({t!r:.40}), not a tensor; "
        "aggregators average state dicts of tensors — store it as torch.tensor(...) "
        "or leave it out of the state"
    )


def _complex(i: int, k: str, t: torch.Tensor) -> AggregationError:
    return AggregationError(
        f"client {i}, key {k!r}: a complex tensor ({t.dtype}); aggregators average "
        "real tensors — store torch.view_as_real(t) and turn it back with "
        "torch.view_as_complex after aggregating"
    )


def _validate(states: list[State]) -> None:
    """Every client's state: tensors, real, of client 0's keys, shapes and dtypes. One pass
    over each client's tensors (a complex tensor after client 0's real one differs in dtype)."""
    ref = states[0]
    meta: dict[str, tuple[torch.Size, torch.dtype]] = {}
    for k, t in ref.items():
        if not isinstance(t, torch.Tensor):
            raise _not_a_tensor(0, k, t)
        if t.is_complex():
            raise _complex(0, k, t)
        meta[k] = (t.shape, t.dtype)
    keys = ref.keys()
    for i, s in enumerate(states[1:], start=1):
        if s.keys() != keys:
            missing, extra = sorted(set(ref) - set(s)), sorted(set(s) - set(ref))
            raise AggregationError(
                f"client {i} has different keys than client 0 — missing: {missing[:5]}, "
                f"unexpected: {extra[:5]}; all clients must train the same graph"
            )
        for k, t in s.items():
            shape, dtype = meta[k]
            if not isinstance(t, torch.Tensor):
                raise _not_a_tensor(i, k, t)
            if t.dtype != dtype:
                if t.is_complex():
                    raise _complex(i, k, t)
                raise AggregationError(
                    f"client {i}, key {k!r}: dtype {t.dtype} differs from client 0's {dtype}; "
                    "all clients must train the same graph and return its dtypes"
                )
            if t.shape != shape:
                raise AggregationError(
                    f"client {i}, key {k!r}: shape {tuple(t.shape)} differs from client 0's "
                    f"{tuple(shape)}; all clients must train the same graph"
                )


SKIP = "drop that client, or pass nonfinite='skip' to leave such clients out and report them"


def _finite(states: list[State], nonfinite: str, fix: str = SKIP) -> list[int]:
    """Indices of clients whose floating tensors are all finite (raise on the first bad one,
    saying ``fix``: a rule without ``nonfinite=`` must not suggest it)."""
    keep = []
    for i, s in enumerate(states):
        bad = next(
            (
                k
                for k, t in s.items()
                if t.is_floating_point() and not bool(torch.isfinite(_wide(t)).all())
            ),
            None,
        )
        if bad is None:
            keep.append(i)
        elif nonfinite == "raise":
            raise AggregationError(f"client {i}, key {bad!r}: the update holds NaN or inf; {fix}")
    if not keep:
        raise AggregationError(
            f"every client's update holds NaN or inf (all {len(states)}); nothing left to "
            "aggregate — look for a too-high client learning rate or bad client data"
        )
    if len(keep) < len(states):
        skipped = sorted(set(range(len(states))) - set(keep))
        warnings.warn(
            f"clients {skipped} skipped: their updates hold NaN or inf",
            RuntimeWarning,
            stacklevel=outside(),
        )
    return keep


def _listed(weights: Any) -> list[Any]:
    try:
        return list(weights)
    except TypeError:
        raise TypeError(
            f"weights must be 'num_examples', 'uniform' or a list, not {weights!r:.60}; give "
            "one number per client, in the order of results, e.g. weights=[120, 80]"
        ) from None


def _weight(i: int, w: Any) -> float:
    if not isinstance(w, (numbers.Real, torch.Tensor)):
        raise TypeError(
            f"client {i}'s weight is {w!r:.60}, not a number; weights holds one number per "
            "client (e.g. its number of examples), in the order of results"
        )
    return float(w)


def _weights(results: Sequence[Any], weights: Any, keep: list[int]) -> list[float]:
    """The ``keep`` clients' weights, normalised to sum to 1."""
    raw = _raw_weights(results, weights)
    used = [raw[i] for i in keep]
    total = sum(used)
    if math.isinf(total):  # every weight is finite: their sum overflowed
        raise AggregationError(
            f"the clients' weights sum to {total} (float overflow); scale them down, "
            "e.g. weights=[w / max(weights) for w in weights]"
        )
    if total <= 0:
        raise AggregationError(
            f"the clients' weights sum to {total}; at least one client must have examples"
        )
    return [w / total for w in used]


def _raw_weights(results: Sequence[Any], weights: Any) -> list[float]:
    """One weight per client, each checked finite and non-negative (errors name its index)."""
    if isinstance(weights, str):
        if weights == "uniform":
            raw = [1.0] * len(results)
        elif weights == "num_examples":
            raw = []
            for i, r in enumerate(results):
                n = getattr(r, "num_examples", None)
                if n is None:
                    raise AggregationError(
                        f"client {i} is a plain state dict and has no num_examples; pass "
                        "weights=[...] (one number per client) or weights='uniform'"
                    )
                raw.append(float(n))
        else:
            raise ValueError(
                f"weights must be 'num_examples', 'uniform' or a list, not {weights!r}"
            )
    elif isinstance(weights, (set, frozenset, Mapping)):
        raise AggregationError(
            f"weights is a {type(weights).__qualname__}: its order is not the clients' order — "
            "pass a list with one number per client, in the order of results"
        )
    else:
        raw = [_weight(i, w) for i, w in enumerate(_listed(weights))]
        if len(raw) != len(results):
            raise AggregationError(
                f"{len(raw)} weights for {len(results)} clients; give one per client"
            )
    for i, w in enumerate(raw):
        if w < 0 or not math.isfinite(w):
            raise AggregationError(
                f"client {i} has weight {w}; weights must be finite and non-negative"
            )
    return raw


def _integer(
    k: str, tensors: list[torch.Tensor], policy: str | None, clients: Sequence[int]
) -> torch.Tensor:
    """The one tensor ``policy`` makes of the clients' integer or bool ``tensors`` (those of
    ``clients``, by index): their maximum (for bools, OR), client 0's, or — for "error" —
    the value they all hold, refusing to choose when they differ."""
    flags = tensors[0].dtype == torch.bool  # "max" of bools is their logical OR
    if policy is None:
        if any(not torch.equal(t, tensors[0]) for t in tensors[1:]):
            kept = (
                "bool tensors differ; keeping their logical OR (True where any client has "
                "True) — pass int_buffers='max' to say so (for bools it is OR)"
                if flags
                else "integer tensors differ; keeping their maximum — pass int_buffers='max' to "
                "say so (BatchNorm's num_batches_tracked: the most-trained client's count)"
            )
            warnings.warn(
                f"key {k!r}: the clients' {kept}, 'first', or 'error'",
                RuntimeWarning,
                stacklevel=outside(),
            )
        policy = "max"
    if policy == "max":
        return torch.stack(tensors).any(0) if flags else torch.stack(tensors).amax(dim=0)
    if policy == "first":
        return tensors[0].clone()
    j = next((j for j, t in enumerate(tensors) if not torch.equal(t, tensors[0])), None)
    if j is None:  # "error", and every client holds the same value: nothing to choose
        return tensors[0].clone()
    a, b = tensors[0], tensors[j]
    at = tuple((a != b).nonzero()[0].tolist()) if a.dim() else ()
    where = f" at {at}" if at else ""
    kind, what, most = (
        ("bool", "flags", "their logical OR")
        if flags
        else ("integer", "counters", "the most-trained client's count")
    )
    raise AggregationError(
        f"key {k!r}: the clients' {kind} tensors ({a.dtype}) differ{where} — client "
        f"{clients[0]} holds {a[at].item()}, client {clients[j]} {b[at].item()} — and "
        f"int_buffers='error' refuses to choose (averaging {what} as floats is wrong); pass "
        f"int_buffers='max' ({most}) or 'first' (client {clients[0]}'s)"
    )


def _check_policies(int_buffers: str | None, nonfinite: str) -> None:
    if int_buffers not in (None, "max", "first", "error"):
        raise ValueError(f"int_buffers must be 'max', 'first' or 'error', not {int_buffers!r}")
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"nonfinite must be 'raise' or 'skip', not {nonfinite!r}")


def _shared(results: Sequence[Any], exclude: Exclude) -> tuple[list[State], frozenset[str]]:
    """The clients' states without the keys ``exclude`` keeps local, and those keys."""
    states = _states(results)
    if exclude is None:  # (nothing to resolve or copy: fedavg's default path)
        return states, frozenset()
    keys = dict.fromkeys(k for s in states for k in s)  # (a client may leave them out)
    local = _local(exclude, keys, "any client's state")
    return _without(states, local), local


def _prepare(
    results: Sequence[Any],
    nonfinite: str,
    int_buffers: str | None,
    exclude: Exclude = None,
    fix: str = SKIP,
) -> tuple[list[State], list[int], frozenset[str]]:
    _check_policies(int_buffers, nonfinite)
    states, local = _shared(results, exclude)
    _validate(states)
    return states, _finite(states, nonfinite, fix), local


def fedavg(
    results: Sequence[Any],
    *,
    weights: str | Sequence[float] = "num_examples",
    int_buffers: IntPolicy = None,
    nonfinite: Literal["raise", "skip"] = "raise",
    exclude: Exclude = None,
) -> Aggregate:
    """The weighted mean of client states, matched by name (FedAvg, McMahan et al. 2017).

    Args:
        results: ``TrainResult``s or plain state dicts, one per client.
        weights: ``"num_examples"`` (each result's training-set size), ``"uniform"``, or
            one non-negative number per client.
        int_buffers: for integer/bool tensors (counters such as ``num_batches_tracked``):
            ``"max"``, ``"first"`` (client 0's), or ``"error"`` (their value when every
            client holds the same, an ``AggregationError`` naming the key, two clients and
            their values when they differ). By default (None) the maximum, with a
            ``RuntimeWarning`` naming the key when the clients' values differ.
        nonfinite: ``"raise"`` on NaN/inf in a client's update, or ``"skip"`` that client
            (a ``RuntimeWarning`` and ``Aggregate.skipped`` report it).
        exclude: keys each client keeps local, not averaged (FedBN: ``fl.batchnorm_keys(g)``):
            key names, ``fnmatch`` patterns (``"*.bn.*"``) or a predicate ``key -> bool``.
            They are left out of the result (``Aggregate.excluded`` lists them), and the
            clients may leave them out of their states.

    Returns:
        An ``Aggregate``: a dict of tensors in each key's original dtype.

    Raises:
        AggregationError: a value that is not a real tensor; mismatched keys, shapes or
            dtypes; NaN/inf; weights given as a set, negative or summing to zero — naming
            the client index and the key; an ``exclude`` name that matches no key.

    Example:
        >>> a = {"w": torch.tensor([0.0, 2.0])}; b = {"w": torch.tensor([2.0, 4.0])}
        >>> fedavg([a, b], weights=[1, 3])["w"]
        tensor([1.5000, 3.5000])
    """
    _check_policies(int_buffers, nonfinite)
    states, local = _shared(results, exclude)
    _validate(states)
    keep = list(range(len(states)))
    with torch.no_grad():  # nn.Parameters in, plain tensors out
        out = _average(states, keep, _weights(results, weights, keep), int_buffers)
        if out is None:
            # A NaN or inf reaches the float64 sum from any client that holds one, so one
            # check of the result stands for a check of every update; only now find which.
            keep = _finite(states, nonfinite)
            out = _average(states, keep, _weights(results, weights, keep), int_buffers)
            if out is None:
                raise AggregationError("the weighted mean overflows float64; scale the updates")
    out.skipped = tuple(sorted(set(range(len(states))) - set(keep)))
    out.selected = tuple(keep)
    if local:
        out.excluded = tuple(sorted(local))
    return out


def _average(
    states: list[State], keep: list[int], share: list[float], int_buffers: str | None
) -> Aggregate | None:
    """The weighted mean of the ``keep`` clients, or None if a float result is not finite."""
    out = Aggregate()
    scratch = _Scratch()
    for k, ref in states[0].items():
        tensors = [states[i][k] for i in keep]
        if not ref.is_floating_point():
            out[k] = _integer(k, tensors, int_buffers, keep)
            continue
        mean = _weighted_mean(tensors, share, ref.dtype, scratch)
        if mean is None:
            return None
        out[k] = mean.view(ref.shape)
    out.weights = tuple(share)
    return out
