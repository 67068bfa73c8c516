"""DP-FedAvg's checks and messages: the noise seed, the counts and δ, the sampling rate of
clients drawn by weight, Opacus's accountant (the ``dp`` extra) and its orders, the search
for σ, the clients' states against the global one, and the refusals of a NaN update, of
a round larger than planned and of float buffers no ``buffer_policy`` covers."""

from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...errors import AggregationError, require
from ...stack import outside
from .aggregation import _finite, _validate
from .sampling import _int, _largest_inclusion

__all__: list[str] = []


# Opacus's default RDP orders stop at 63, where a large σ's ε is loosest (σ = 20, q = 0.01,
# 500 rounds: 0.107, warning to widen them; 0.035 with these): every order gives a valid bound
ORDERS = (
    [1 + x / 10.0 for x in range(1, 100)]
    + list(range(12, 64))
    + list(range(64, 256, 8))
    + [256, 320, 384, 512, 768, 1024]
)


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


def _counts(clients: int, per_round: int) -> tuple[int, int]:
    """``clients`` and ``per_round`` as ints, checked: 0 < per_round ≤ clients."""
    clients = _int("clients", clients, 1, "a positive int (how many there are)")
    per_round = _int("per_round", per_round, 1, "a positive int (how many a round trains)")
    if per_round > clients:
        raise ValueError(
            f"need 0 < per_round ≤ clients (ints), not per_round={per_round!r}, clients={clients!r}"
        )
    return clients, per_round


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


def _matching(
    global_state: Mapping[str, torch.Tensor], states: list[Any], local: frozenset[str]
) -> None:
    """The clients' states match each other and the global state, and are finite."""
    _validate(states)
    _finite(states, "raise", _DROP)
    if global_state.keys() - local != states[0].keys():
        diff = sorted((set(global_state) - local) ^ set(states[0]))
        raise AggregationError(
            f"the clients' states and the global state differ in {diff[:5]}; clients must "
            "return the state they were sent, with all of its keys"
        )
    for k, t in states[0].items():
        x = global_state[k]
        if t.dtype != x.dtype or t.shape != x.shape:
            raise AggregationError(
                f"key {k!r}: the clients hold {t.dtype} {tuple(t.shape)}, the global state's "
                f"{x.dtype} {tuple(x.shape)}; clients must return the state they were sent"
            )


def _check_count(n: int, clients: int, per_round: int, poisson: bool, rate: float) -> None:
    """ε is charged at rate per_round / clients: a round of more updates than clients is a
    mistake, and one of more than per_round is either a Poisson draw's spread or clients
    chosen otherwise, which the accountant cannot see (ε under-reported)."""
    if n > clients:
        raise AggregationError(
            f"DPFedAvg(clients={clients}) got {n} updates in one round, more than there are "
            "clients; pass clients= the population the round's clients are drawn from"
        )
    if n > per_round and not poisson:
        warnings.warn(
            f"DPFedAvg(per_round={per_round}) got {n} updates in one round: epsilon is "
            f"charged as if each client took part with probability {rate:.4g} (Poisson "
            "sampling, whose count varies). If the round's clients were chosen otherwise "
            "(every client, or a larger fixed draw), epsilon is under-reported: set "
            "per_round to the number each round trains; for Poisson draws "
            "(dp.sample(round)), pass poisson=True",
            stacklevel=outside(),
        )


def _check_delta(delta: float, clients: int) -> None:
    """δ in (0, 1), and below 1/clients or a warning: one client published whole, drawn at
    random, is (0, 1/clients)-DP."""
    if isinstance(delta, bool) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), typically below 1/clients, not {delta!r}")
    if delta >= 1 / clients:
        warnings.warn(
            f"delta={delta!r}: a delta of 1/clients ({1 / clients:.3g}) or more allows "
            "publishing one client's data whole (one drawn at random is (0, 1/clients)-DP); "
            "take delta well below 1/clients (e.g. 1e-5 for 1,000 clients)",
            stacklevel=outside(),
        )


def _noise_for(epsilon: float, rounds: int, rate: float, delta: float) -> float:
    """The smallest σ (to 0.01 in ε) whose ε after ``rounds`` at ``rate`` is ``epsilon`` at
    most, by Opacus's search over its RDP accountant, on DPFedAvg's orders."""
    if isinstance(epsilon, bool) or not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a positive finite target, not {epsilon!r}")
    utils: Any = require("opacus.accountants.utils", "dp")
    with warnings.catch_warnings():  # (the search's probes at σ = 20, 40...: not the answer)
        warnings.filterwarnings("ignore", "Optimal order is the largest alpha")
        try:
            sigma = utils.get_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=rate,
                steps=rounds,
                accountant="rdp",
                alphas=ORDERS,
            )
        except ValueError as e:
            raise ValueError(
                f"no noise multiplier up to 1e6 reaches epsilon={epsilon!r} at delta={delta!r} "
                f"after {rounds} rounds at sampling rate {rate:.4g} (Opacus: {e}); aim for a "
                "larger epsilon or delta, or fewer rounds or clients per round"
            ) from e
    return float(sigma)


def _fixed_draw_warning(rate: float) -> str:
    """What ``epsilon`` says once when the loop did not say it draws Poisson samples."""
    return (
        f"DPFedAvg.epsilon: this is the ε of Poisson sampling at rate {rate:.4g}, drawn in "
        "secret — the only draw the accountant analyses. Built without poisson=True, the "
        "loop draws some other way (a fixed count, fl.sample(count=), or by weight), for "
        "which it is not a bound: a fixed count can cost several times more "
        "(docs/federated.md, Differential privacy). Draw with dp.sample(round) and build "
        "DPFedAvg(..., poisson=True) for an ε that is a bound"
    )


def _other_settings(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> str | None:
    """What ``load_state_dict`` says when the checkpoint's rounds ran with other settings."""
    differ = [
        f"{k}={v!r} (this DPFedAvg: {mine[k]!r})"
        for k, v in saved.items()
        if k in mine and v != mine[k]
    ]
    if not differ:
        return None
    named = ("clip", "noise", "clients", "per_round")
    call = ", ".join(f"{k}={v!r}" for k, v in saved.items() if k in named)
    return (
        f"DPFedAvg.load_state_dict: the checkpoint's rounds ran with {', '.join(differ)}. "
        "The rounds from now on run with this object's settings; epsilon stays right "
        "(the accountant's history holds each round's noise and rate), but if this is "
        "a resume, build DPFedAvg with the checkpoint's settings: "
        f"fl.DPFedAvg({call}, ...)"
    )
