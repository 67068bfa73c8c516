"""Central differential privacy: DP-FedAvg (McMahan et al. 2018, "Learning differentially
private recurrent language models").

Each round, every client's update (its state minus the global state) is clipped to
L2 norm C, the clipped updates are summed, Gaussian noise of standard deviation σ·C
is added to each coordinate of the sum, and the sum is divided by the expected
number of clients per round (the paper's fixed-denominator estimator). The
privacy spent is tracked by Opacus's RDP accountant — somatize has no accountant of
its own (``pip install 'somatize[dp]'``)::

    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, seed=0)
    for r in range(rounds):
        ...
        global_state = dp.step(global_state, results)
        print(r, dp.epsilon(delta=1e-5))

The accountant analyses Poisson sampling of clients at rate q = per_round / clients;
drawing a fixed count per round with ``fl.sample`` is the usual approximation of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...errors import AggregationError, require
from .aggregation import _finite, _states, _validate
from .robust import clip_state

__all__ = ["DPFedAvg"]


def _accountant() -> Any:
    accountants = require("opacus.accountants", "dp")
    return accountants.RDPAccountant()  # type: ignore[attr-defined]


class DPFedAvg:
    """DP-FedAvg with a fixed clip norm; ``step`` aggregates, ``epsilon`` reports the cost.

    Args:
        clip: C, the L2 bound on each client's update (all floating tensors together).
        noise: σ, the noise multiplier: each coordinate of the sum gets N(0, (σC)²).
        clients: N, how many clients there are in all.
        per_round: how many take part in a round (the sampling rate is per_round / N;
            the sum of clipped updates is divided by per_round).
        seed: seeds the noise (its generator is part of ``state_dict()``).

    Attributes:
        rounds: rounds aggregated so far.
        norms: the unclipped update norms of the last round, one per client.
    """

    def __init__(
        self, *, clip: float, noise: float, clients: int, per_round: int, seed: int = 0
    ) -> None:
        if not (clip > 0 and math.isfinite(clip)):
            raise ValueError(f"clip must be a positive finite norm, not {clip!r}")
        if not (noise >= 0 and math.isfinite(noise)):
            raise ValueError(f"noise must be a non-negative multiplier, not {noise!r}")
        if not (
            isinstance(per_round, int) and isinstance(clients, int) and 0 < per_round <= clients
        ):
            raise ValueError(
                f"need 0 < per_round ≤ clients (ints), not per_round={per_round!r}, "
                f"clients={clients!r}"
            )
        self.clip, self.noise = float(clip), float(noise)
        self.per_round, self.sample_rate = per_round, per_round / clients
        self.accountant = _accountant()
        self.generator = torch.Generator().manual_seed(seed)
        self.rounds = 0
        self.norms: tuple[float, ...] = ()

    def step(
        self, global_state: Mapping[str, torch.Tensor], results: Sequence[Any]
    ) -> dict[str, torch.Tensor]:
        """The next global state from this round's client results (``TrainResult``s or states)."""
        states = _states(results)
        _validate(states)
        _finite(states, "raise")
        if global_state.keys() != states[0].keys():
            diff = sorted(set(global_state) ^ set(states[0]))
            raise AggregationError(f"the clients' states and the global state differ in {diff[:5]}")
        for k, x in global_state.items():
            t = states[0][k]
            if t.dtype != x.dtype or t.shape != x.shape:
                raise AggregationError(
                    f"key {k!r}: the clients hold {t.dtype} {tuple(t.shape)}, the global state's "
                    f"{x.dtype} {tuple(x.shape)}; clients must return the state they were sent"
                )
        expected = self.per_round
        keys = [k for k, t in global_state.items() if t.is_floating_point()]
        with torch.no_grad():
            total = {k: torch.zeros(global_state[k].shape, dtype=torch.float64) for k in keys}
            norms = []
            for s in states:
                clipped, norm = clip_state(s, global_state, self.clip)
                norms.append(norm)
                for k in keys:
                    total[k] += clipped[k].to(torch.float64) - global_state[k].to(torch.float64)
            out: dict[str, torch.Tensor] = {}
            for k, x in global_state.items():
                if k not in total:
                    out[k] = torch.stack([s[k] for s in states]).amax(0)  # counters
                    continue
                noise = torch.randn(x.shape, dtype=torch.float64, generator=self.generator)
                mean = (total[k] + noise * (self.noise * self.clip)) / expected
                out[k] = (x.to(torch.float64) + mean).to(x.dtype)
        if self.noise > 0:
            self.accountant.step(noise_multiplier=self.noise, sample_rate=self.sample_rate)
        self.rounds += 1
        self.norms = tuple(norms)
        return out

    def epsilon(self, delta: float) -> float:
        """ε spent so far at this δ (Opacus's RDP accountant); inf without noise."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), typically below 1/clients, not {delta!r}")
        if self.rounds == 0:
            return 0.0
        if self.noise == 0:
            return math.inf
        return float(self.accountant.get_epsilon(delta=delta))

    def state_dict(self) -> dict[str, Any]:
        """Rounds, the accountant's history and the noise generator (for an exact resume)."""
        return {
            "rounds": self.rounds,
            "history": [tuple(h) for h in self.accountant.history],
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict()`` returned."""
        self.rounds = int(state["rounds"])
        self.accountant.history = [tuple(h) for h in state["history"]]
        self.generator.set_state(state["generator"])
