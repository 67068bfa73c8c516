"""DP-FedAvg's checks of its settings, and its messages: the noise seed, the sampling
rate of clients drawn by weight, Opacus's accountant (the ``dp`` extra), and the
refusals of a NaN update and of float buffers no ``buffer_policy`` covers."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import AggregationError, require
from .sampling import _largest_inclusion

__all__: list[str] = []


def _accountant() -> Any:
    accountants = require("opacus.accountants", "dp")
    return accountants.RDPAccountant()  # type: ignore[attr-defined]


def _seed(seed: int | None) -> int:
    """The noise generator's seed: ``seed`` as given, or 64 bits from the OS for None."""
    if seed is None:
        return secrets.randbits(64)
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**64:
        raise ValueError(
            f"seed must be None (drawn from the OS: the default, for any release) or an int "
            f"in [-2**63, 2**64) (reproducible experiments only), not {seed!r}"
        )
    return seed


def _rate(weights: Sequence[float], clients: int, per_round: int) -> float:
    """The rate ε is charged at when clients are drawn by ``weights`` (sampling.py)."""
    if isinstance(weights, (str, Mapping)) or not hasattr(weights, "__len__"):
        raise ValueError(
            f"weights must be the list of sampling weights given to fl.sample(weights=), "
            f"one per client, not {weights!r:.60}"
        )
    try:
        return _largest_inclusion(weights, per_round, clients)
    except ValueError as e:
        raise ValueError(f"DPFedAvg(weights=): {e}; pass those given to fl.sample") from None


_DROP = (
    "an update with NaN or inf cannot be clipped, and DPFedAvg takes no nonfinite=: drop "
    "that client's result before dp.step (the sum is still divided by per_round, so a "
    "dropped client does not weaken the guarantee)"
)


def _refusal(keys: list[str]) -> AggregationError:
    more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
    return AggregationError(
        f"DPFedAvg: {keys[:3]}{more} are float buffers (BatchNorm's running statistics), and "
        "DP-FedAvg's guarantee covers only what it clips and noises — say what to do with "
        "them: buffer_policy='global' (keep the server's values: private, but they never "
        "learn from the clients; FedBN keeps them on the clients instead), 'noised' (clipped "
        "and noised with the update, as weights: private, but they share the clip norm with "
        "the weights and noise can push running_var below zero), or 'unprotected_mean' (their "
        "plain mean, neither clipped nor noised: NOT covered by epsilon, it reveals each "
        "client's feature statistics); or replace BatchNorm by GroupNorm, as Opacus's "
        "ModuleValidator.fix does"
    )
