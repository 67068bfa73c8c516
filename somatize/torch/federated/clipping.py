"""Norm clipping: each client's update (its state minus the global state) scaled down to
L2 norm C at most, the norm taken in float64 over every floating key not left out.

Two rules share it. ``fl.clip`` bounds what one client can move the model before any
aggregator (robustness) and hands back states in the model's dtype: each clipped
coordinate is rounded toward the global value, never past the scaled update, so the
update a fp16/bf16 state carries stays within C (round-to-nearest could add half an
ulp per coordinate: a bf16 update of one ulp per weight came back 1.56 × C).
``DPFedAvg`` bounds each client's contribution to its noised sum (privacy): it sums
``clip_update``'s float64 update directly, never a state rounded to the model's dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import torch

from ...errors import AggregationError
from ...stack import outside
from .aggregation import State, _states, _validate
from .keys import NAME_BUFFERS, Exclude, _local, _names, _statistics, _unknown, _without

__all__ = ["clip"]


def clip(
    results: Sequence[Any],
    global_state: Mapping[str, torch.Tensor],
    max_norm: float,
    *,
    buffers: Iterable[str] = (),
    exclude: Exclude = None,
) -> list[Any]:
    """Each client's update (state − global) scaled down to L2 norm ``max_norm`` at most.

    The norm is taken over every floating tensor of the state together, except the keys
    named in ``buffers``. Returns the same kind of thing it was given (``TrainResult``s
    keep their ``num_examples``), to pass on to ``fedavg`` or any aggregator: norm clipping
    bounds what one client can move the model (Sun et al. 2019, "Can you really backdoor
    federated learning?"). A clipped state is in the model's dtype, each coordinate rounded
    toward the global value, so its update's norm is ``max_norm`` at most in fp16 and
    bf16 too (a coordinate whose scaled move is below what the dtype can represent there
    stays where it was); an update within the norm is passed on as sent.

    Args:
        buffers: keys that are not weights (BatchNorm's running statistics): left out of
            the norm and passed on as the client sent them. A client's statistics move
            with its data, not its training, and counted in the norm they would shrink its
            weights' update. ``[k for k, _ in st.module(g).named_buffers()]`` names them;
            float keys named ``running_mean``/``running_var`` left out of it warn (a
            ``UserWarning``) and are clipped with the weights.
        exclude: keys the clients keep local (FedBN), as in ``fedavg``: not measured, not
            scaled, passed on as sent (a client may leave them out).

    Example:
        >>> g = {"w": torch.zeros(2)}
        >>> clip([{"w": torch.tensor([3.0, 4.0])}], g, max_norm=1.0)[0]["w"]
        tensor([0.6000, 0.8000])
    """
    try:  # (a str compared with 0 is Python's TypeError: said as the range instead)
        bad = isinstance(max_norm, bool) or not max_norm > 0 or math.isinf(max_norm)
    except TypeError:
        bad = True
    if bad:
        raise ValueError(
            f"max_norm must be a positive finite number, not {max_norm!r:.40}; e.g. max_norm=1.0"
        )
    named = _names("buffers", buffers)
    states = _states(results)
    keys = {**global_state, **states[0]}.keys()
    local = _local(exclude, keys, "the global state or client 0's")
    _validate(_without(states, local))
    if global_state.keys() - local != states[0].keys() - local:
        missing = sorted((set(states[0]) ^ set(global_state)) - local)
        raise AggregationError(
            f"the global state and the clients' states differ in keys {missing[:5]}; clip "
            "updates of the global state the clients started from"
        )
    _unknown("buffers", named, global_state)
    moved = _statistics(global_state, named | local)
    if moved:
        warnings.warn(
            f"{moved[0]!r} (and {len(moved) - 1} more) look like BatchNorm running statistics, "
            f"which clip measures and scales as part of each update; pass {NAME_BUFFERS} to "
            "leave them out of the norm",
            UserWarning,
            stacklevel=outside(),
        )
    out: list[Any] = []
    with torch.no_grad():
        for r, s in zip(results, states):
            clipped, _ = clip_state(s, global_state, max_norm, exclude=named | local)
            out.append(
                dataclasses.replace(r, state=clipped)
                if dataclasses.is_dataclass(r) and not isinstance(r, type)
                else clipped
            )
    return out


def clip_update(
    state: State,
    global_state: Mapping[str, torch.Tensor],
    max_norm: float,
    exclude: Collection[str] = (),
) -> tuple[dict[str, torch.Tensor], float]:
    """``state``'s update (state − global, float64) over the floating keys not in
    ``exclude``, scaled so that its norm, computed in float64, is ``max_norm`` at most;
    and the update's norm before clipping. Nothing is rounded to the model's dtype."""
    keys = [k for k, t in global_state.items() if t.is_floating_point() and k not in exclude]
    update = {
        k: state[k].detach().to(torch.float64) - global_state[k].to(torch.float64) for k in keys
    }
    norm = after = _norm(update)
    scale = max_norm / norm if norm > max_norm else 1.0  # (a NaN norm: left as it is)
    while scale < 1.0:  # twice at most: once, and again if float64 rounding left it above
        for d in update.values():
            d.mul_(scale)
        after = _norm(update)
        scale = math.nextafter(max_norm / after, 0.0) if after > max_norm else 1.0
    return update, norm


def clip_state(
    state: State,
    global_state: Mapping[str, torch.Tensor],
    max_norm: float,
    exclude: Collection[str] = (),
) -> tuple[dict[str, torch.Tensor], float]:
    """``state`` with its update clipped to ``max_norm``, in the model's dtypes, and the
    update's norm before clipping (over the floating keys not in ``exclude``, which are
    left as they are). Each clipped coordinate is rounded toward the global value, so the
    rounded update is no longer than the float64 one, coordinate by coordinate."""
    update, norm = clip_update(state, global_state, max_norm, exclude)
    clipped = dict(state)
    if not norm > max_norm:  # within the norm: the state as sent
        return clipped, norm
    for k, u in update.items():
        clipped[k] = _toward(global_state[k], u)
    return clipped, norm


def _norm(update: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of every tensor together, in float64. When the sum of squares overflows
    (an update of 1e154 or more) or underflows, it is taken again on the update divided by
    its largest magnitude: an overflowed norm of inf would scale the update to zeros."""
    squares = sum(float(d.pow(2).sum()) for d in update.values())
    if not (math.isinf(squares) or squares < sys.float_info.min):
        return math.sqrt(squares)  # (a NaN too: left to the caller)
    big = max((float(d.abs().max()) for d in update.values() if d.numel()), default=0.0)
    if not 0 < big < math.inf:  # all zeros, or an infinite update
        return math.sqrt(squares)
    return big * math.sqrt(sum(float((d / big).pow(2).sum()) for d in update.values()))


def _toward(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``x + u`` in ``x``'s dtype, rounded to nearest unless that lands past ``x + u``: then
    the neighbour toward ``x`` (``u`` float64; the result's move is at most ``|u|``)."""
    x64 = x.detach().to(torch.float64)
    if x.dtype.itemsize == 1:  # float8: torch has no nextafter for them
        return _toward_on_grid(x64, u, x.dtype)
    y = (x64 + u).to(x.dtype)
    past = (y.to(torch.float64) - x64).abs() > u.abs()
    return torch.where(past, torch.nextafter(y, x.detach().to(y.device)), y)


@functools.cache
def _grid(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of a 1-byte float dtype, sorted, in float64 (all 256 bit patterns)."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float64)
    grid: torch.Tensor = values[torch.isfinite(values)].unique()  # (sorted; -0 and +0: one)
    return grid


def _toward_on_grid(x64: torch.Tensor, u: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What ``_toward`` gives, for a float8 ``dtype``: ``x + u`` rounded toward ``x`` on the
    dtype's grid of values — the nearest value unless that is past ``x + u``, whose
    neighbour toward ``x`` is the value on the near side. (``x`` is on the grid, so the
    result lies between ``x`` and ``x + u``.)"""
    grid = _grid(dtype).to(u.device)
    v = x64 + u
    last = len(grid) - 1
    below = grid[(torch.searchsorted(grid, v, right=True) - 1).clamp(0, last)]  # largest ≤ v
    above = grid[torch.searchsorted(grid, v).clamp(0, last)]  # smallest ≥ v
    return torch.where(u > 0, below, torch.where(u < 0, above, x64)).to(dtype)
