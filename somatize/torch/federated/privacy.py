"""Central differential privacy: DP-FedAvg (McMahan et al. 2018, "Learning differentially
private recurrent language models").

Each round, every client's update (its state minus the global state) is clipped to
L2 norm C, the clipped updates are summed, Gaussian noise of standard deviation σ·C
is added to each coordinate of the sum, and the sum is divided by the expected
number of clients per round (the paper's fixed-denominator estimator). The
privacy spent is tracked by Opacus's RDP accountant — somatize has no accountant of
its own (``pip install 'somatize[dp]'``)::

    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, poisson=True)
    for r in range(rounds):
        chosen = dp.sample(r)        # each client with probability 10 / 100, secretly
        ...
        global_state = dp.step(global_state, results)
        print(r, dp.epsilon(delta=1e-5))

The accountant analyses Poisson sampling of clients at rate q = per_round / clients,
drawn where nobody can see who took part: ``dp.sample(round)`` draws that, from a seed
as secret as the noise's. Two draws the accountant does not analyse, whose ε it
under-reports: a fixed count per round (``fl.sample(count=)``: 100 rounds at σ = 1,
q = 0.1 cost ε ≥ 31.3 at δ = 1e-5 under the replacement of one client, where 7.9 is
reported), and any draw whose seed is known (``fl.sample``'s default seed is 0):
who took part is then public, and sampling hides nothing (a client in 10 of those 100
rounds: ε = 17.9). Clients drawn by weight
(``fl.sample(..., weights=sizes)``) are not drawn at rate q: a big client takes part more
often, so give ``DPFedAvg`` the same ``weights=`` and ε is charged at the most likely
client's rate (an upper bound on it; a fixed count all the same).

Float buffers (BatchNorm's running statistics) are not weights, and ε covers only what
is clipped and noised: a state holding any is refused until ``buffer_policy=`` says what
to do with them (keep the server's, noise them with the update, or average them in the
clear, which ε does not cover). Opacus refuses BatchNorm under DP-SGD for the same reason.
Integer buffers (counters) cannot be noised: the global state's are kept, unless
``buffer_policy="unprotected_mean"`` publishes the clients' maximum in the clear.

The noise comes from a ``torch.Generator`` seeded from the operating system
(``secrets``) unless ``seed=`` fixes it. That generator (a Mersenne Twister) is not a
cryptographically secure one, and ``state_dict()`` holds its state: whoever has a
checkpoint of it can regenerate the noise of every later round, so keep checkpoints
as private as the clients' updates. A fixed ``seed=`` is for reproducible experiments,
never for a release: anyone who knows it can subtract the noise.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import torch

from ...stack import outside
from .aggregation import _states
from .clipping import clip_update
from .keys import (
    Exclude,
    _local,
    _names,
    _rule,
    _statistics,
    _unchanged,
    _unchanged_warning,
    _unknown,
    _without,
)
from .privacy_checks import (
    ORDERS,
    _accountant,
    _check_count,
    _check_delta,
    _counts,
    _fixed_draw_warning,
    _matching,
    _noise_for,
    _other_settings,
    _rate,
    _refusal,
    _seed,
)
from .sampling import _int, sample

__all__ = ["DPFedAvg"]


BufferPolicy = Literal["global", "noised", "unprotected_mean"]
_POLICIES = ("global", "noised", "unprotected_mean")


class DPFedAvg:
    """DP-FedAvg with a fixed clip norm; ``step`` aggregates, ``epsilon`` reports the cost.

    Args:
        clip: C, the L2 bound on each client's update (all floating tensors together).
        noise: σ, the noise multiplier: each coordinate of the sum gets N(0, (σC)²).
        clients: N, how many clients there are in all.
        per_round: how many take part in a round (the sampling rate is per_round / N;
            the sum of clipped updates is divided by per_round).
        weights: the sampling weights the loop gives ``fl.sample(..., weights=)``, one per
            client, if it draws by weight: ε is then charged at the largest probability
            with which any client is drawn in a round (``sample_rate``; an upper bound on
            it, exact for equal weights) instead of per_round / N, which would under-report
            the big clients' ε. Without them, clients must be drawn uniformly.
        poisson: the loop draws Poisson samples with ``dp.sample(round)``, which the
            accountant analyses exactly: a round's count varies around ``per_round``, so a
            round of more does not warn (by default it does: ε would be under-reported if
            a fixed draw took more than ``per_round``).
        seed: None (the default): the noise generator and ``sample``'s draws are seeded
            from the operating system's randomness (``secrets``), so nobody can regenerate
            the noise or tell who took part. An int fixes both, for reproducible
            experiments only — anyone who knows the seed can subtract the noise from the
            published model. Either way ``state_dict()`` holds them: keep checkpoints of it
            as private as the clients' updates. ``torch.Generator`` is not a
            cryptographically secure generator.
        buffers: the keys that are buffers, not weights
            (``[k for k, _ in st.module(g).named_buffers()]``).
        buffer_policy: what DP does with the float buffers — the float keys ``buffers``
            names, and any float key named ``running_mean`` or ``running_var``. Without
            one, a state holding any is refused, naming them. ``"global"``: the global
            state's values are kept (every integer buffer too, named or not): left out of the update,
            its norm and its noise — private, but they learn nothing from the clients.
            ``"noised"``: clipped and noised with the update, as weights are.
            ``"unprotected_mean"``: the clients' plain mean, neither clipped nor noised, and
            the integer buffers' maximum — **not covered by** ``epsilon``. Under any other
            policy (or none), integer tensors keep the global state's values.
        exclude: keys the clients keep local (FedBN: ``fl.batchnorm_keys(g)``), as in
            ``fedavg``: the global state's values are kept, nothing of them leaves a client
            (the clients may leave them out), and they need no ``buffer_policy``.

    Attributes:
        sample_rate: the rate ε is charged at: per_round / clients, or with ``weights=``
            the most likely client's rate.
        rounds: rounds aggregated so far.
        norms: the unclipped update norms of the last round, one per client — the
            server's to see, not covered by ε: publishing them leaks what noise protects.
    """

    def __init__(
        self,
        *,
        clip: float,
        noise: float,
        clients: int,
        per_round: int,
        weights: Sequence[float] | None = None,
        poisson: bool = False,
        seed: int | None = None,
        buffers: Iterable[str] = (),
        buffer_policy: BufferPolicy | None = None,
        exclude: Exclude = None,
    ) -> None:
        try:  # (a str compared with 0 is Python's TypeError: said as the range instead)
            bad_clip = isinstance(clip, bool) or not (clip > 0 and math.isfinite(clip))
            bad_noise = isinstance(noise, bool) or not (noise >= 0 and math.isfinite(noise))
        except TypeError:
            bad_clip = bad_noise = True
        if bad_clip:
            raise ValueError(
                f"clip must be a positive finite norm, not {clip!r:.40}; e.g. clip=1.0"
            )
        if bad_noise:
            raise ValueError(
                f"noise must be a non-negative multiplier, not {noise!r:.40}; e.g. noise=1.1"
            )
        clients, per_round = _counts(clients, per_round)
        if buffer_policy is not None and buffer_policy not in _POLICIES:
            raise ValueError(
                f"buffer_policy must be 'global', 'noised' or 'unprotected_mean', not "
                f"{buffer_policy!r}"
            )
        if not isinstance(poisson, bool):
            raise ValueError(f"poisson must be True or False, not {poisson!r}")
        if poisson and weights is not None:
            raise ValueError(
                "poisson=True draws every client at the rate per_round / clients: it takes no "
                "weights= (fl.sample(rate=) takes none either)"
            )
        self.poisson = poisson
        self.clip, self.noise = float(clip), float(noise)
        self.clients, self.per_round = clients, per_round
        self.sample_rate = (
            per_round / clients if weights is None else _rate(weights, clients, per_round)
        )
        self.buffers, self.buffer_policy = _names("buffers", buffers), buffer_policy
        self.exclude = _rule(exclude)
        self.accountant = _accountant()
        self.generator = torch.Generator().manual_seed(_seed(seed))
        self._draws = _seed(seed) % 2**64  # sample()'s: another from the OS, or seed=
        self.rounds = 0
        self.norms: tuple[float, ...] = ()
        self._warned_unchanged = False
        self._warned_draw = False

    def _kept(
        self, global_state: Mapping[str, torch.Tensor], local: frozenset[str]
    ) -> tuple[frozenset[str], frozenset[str]]:
        """The keys left out of the private update: those whose global value is kept (the
        local keys, the integer ones unless 'unprotected_mean', the buffers under 'global')
        and those averaged in the clear (the float buffers under 'unprotected_mean')."""
        _unknown("buffers", self.buffers, global_state)
        named = self.buffers - local
        floats = [k for k in named if global_state[k].is_floating_point()]
        floats += _statistics(global_state, named | local)
        if floats and self.buffer_policy is None:
            raise _refusal(sorted(floats))
        # integer keys (counters) cannot be noised: the server's, unless published in the clear
        ints = frozenset(
            k for k, t in global_state.items() if not (t.is_floating_point() or t.is_complex())
        )
        if self.buffer_policy == "global":
            return local | named | frozenset(floats) | ints, frozenset()
        if self.buffer_policy == "unprotected_mean":  # (the integer keys: the clients' max)
            return local, frozenset(floats)
        return local | ints, frozenset()

    def step(
        self, global_state: Mapping[str, torch.Tensor], results: Sequence[Any]
    ) -> dict[str, torch.Tensor]:
        """The next global state from this round's client results (``TrainResult``s or states).

        A round without results — a Poisson draw of nobody, or one whose every client
        failed — is a round all the same: the noise alone is added (divided by
        ``per_round``, as always) and the round is charged; skipping it would reveal that
        nobody took part, uncharged.

        Raises:
            AggregationError: the clients' states do not match each other or the global
                state; NaN or inf in an update; float buffers without a ``buffer_policy``
                (the error names them and the choices).
        """
        empty = isinstance(results, Sequence) and not isinstance(results, Mapping) and not results
        states = [] if empty else _states(results)
        _check_count(len(states), self.clients, self.per_round, self.poisson, self.sample_rate)
        local = _local(self.exclude, global_state.keys(), "the global state")
        states = _without(states, local)
        if states:
            _matching(global_state, states, local)
        kept, clear = self._kept(global_state, local)
        expected = self.per_round
        keys = [
            k
            for k, t in global_state.items()
            if t.is_floating_point() and k not in kept and k not in clear
        ]
        if not self._warned_unchanged and (still := _unchanged(global_state, states, keys)):
            self._warned_unchanged = True  # (the server's to see, as dp.norms: never published)
            warnings.warn(_unchanged_warning("DPFedAvg", still), stacklevel=outside())
        with torch.no_grad():
            total = {k: torch.zeros_like(global_state[k], dtype=torch.float64) for k in keys}
            norms = []
            for s in states:  # float64 updates of norm ≤ C, summed as they are: never rounded
                update, norm = clip_update(s, global_state, self.clip, exclude=kept | clear)
                norms.append(norm)
                for k in keys:
                    total[k] += update[k]
            out: dict[str, torch.Tensor] = {}
            for k, x in global_state.items():
                if k in kept or (not states and k not in total):  # (no client: the server's)
                    out[k] = x.detach().clone()
                elif k in clear:  # unprotected_mean: the clients' values, in the clear
                    mean = torch.stack([s[k].detach().to(torch.float64) for s in states]).mean(0)
                    out[k] = mean.to(x.dtype)
                elif k not in total:
                    out[k] = torch.stack([s[k] for s in states]).amax(0)  # counters
                else:
                    noise = torch.randn(x.shape, dtype=torch.float64, generator=self.generator)
                    noise = noise.to(x.device)  # (drawn on the CPU, summed where the state is)
                    mean = (total[k] + noise * (self.noise * self.clip)) / expected
                    out[k] = (x.to(torch.float64) + mean).to(x.dtype)
        if self.noise > 0:
            self.accountant.step(noise_multiplier=self.noise, sample_rate=self.sample_rate)
        self.rounds += 1
        self.norms = tuple(norms)
        return out

    def sample(self, round: int) -> list[int]:
        """The clients of round ``round``, sorted: each of the ``clients`` independently with
        probability ``sample_rate`` — the Poisson sampling ε is charged for — drawn from a
        seed nobody else knows (the operating system's, or ``seed=``).

        ``fl.sample(clients, rate=..., seed=s)`` draws the same way, but from ``s``, which is
        public unless you keep it secret (0 by default): whoever knows it knows who took
        part in each round, and ε, which counts on that being hidden, is under-reported.
        The draw is deterministic in (the seed, ``round``), and ``state_dict()`` holds the
        seed, so a resumed loop draws what the crashed one would have.

        Raises:
            ValueError: without ``poisson=True`` (its count varies around ``per_round``).

        Example:
            >>> dp = DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=10, poisson=True)
            >>> chosen = dp.sample(0)   # about 10 of the 100, any number (0 included)
            >>> all(0 <= c < 100 for c in chosen)
            True
        """
        if not self.poisson:
            raise ValueError(
                "dp.sample draws each client with probability sample_rate, so a round's count "
                f"varies around per_round={self.per_round}: build the DPFedAvg with "
                "poisson=True to say the loop draws so"
            )
        return sample(self.clients, rate=self.sample_rate, round=round, seed=self._draws)

    @staticmethod
    def noise_for(
        epsilon: float, *, delta: float, rounds: int, clients: int, per_round: int
    ) -> float:
        """The noise multiplier σ whose ε after ``rounds`` Poisson rounds of ``per_round`` of
        ``clients`` is ``epsilon`` at most (within 0.01), at ``delta`` — Opacus's search
        (``get_noise_multiplier``) over the accountant ``epsilon`` reports from. A
        ``delta`` of 1/clients or more warns, as in ``epsilon``.

        Raises:
            ValueError: a target no σ up to 1e6 reaches (an ε below about 1e-5), naming it.

        Example:
            >>> sigma = DPFedAvg.noise_for(8.0, delta=1e-5, rounds=500, clients=1000, per_round=10)
            >>> round(sigma, 3)
            0.573
        """
        rounds = _int("rounds", rounds, 1, "a positive int (how many rounds will run)")
        clients, per_round = _counts(clients, per_round)
        _check_delta(delta, clients)
        return _noise_for(epsilon, rounds, per_round / clients, delta)

    def epsilon(self, delta: float) -> float:
        """ε spent so far at this δ (Opacus's RDP accountant, over orders up to 1024 where
        its default stops at 63); inf without noise.

        A δ of 1/clients or more warns: it allows publishing one client's data whole. So
        does the first finite ε without ``poisson=True`` (fewer than all clients a round):
        it is not a bound for a fixed count or a draw by weight (docs/federated.md)."""
        _check_delta(delta, self.clients)
        if self.rounds == 0:
            return 0.0
        # a round without noise is not in the accountant's history (it charges none), and
        # costs ε = ∞: one before a resume with noise counts as much as one now
        charged = sum(int(h[2]) for h in self.accountant.history)
        if self.noise == 0 or charged < self.rounds:
            return math.inf
        if not (self.poisson or self._warned_draw or self.sample_rate >= 1):
            self._warned_draw = True
            warnings.warn(_fixed_draw_warning(self.sample_rate), stacklevel=outside())
        return float(self.accountant.get_epsilon(delta=delta, alphas=ORDERS))

    def _settings(self) -> dict[str, Any]:
        return {
            "clip": self.clip,
            "noise": self.noise,
            "sample_rate": self.sample_rate,
            "clients": self.clients,
            "per_round": self.per_round,
            "poisson": self.poisson,
        }

    def state_dict(self) -> dict[str, Any]:
        """Rounds, the accountant's history, the noise generator and ``sample``'s seed (for
        an exact resume) and the settings (``clip``, ``noise``, ``sample_rate``,
        ``clients``, ``per_round``, ``poisson``) its rounds ran under.

        The generator's state regenerates the noise of every round after it, and the seed
        tells who took part in every round: keep what this returns (and checkpoints
        holding it) as private as the clients' updates.
        """
        return {
            "rounds": self.rounds,
            "history": [tuple(h) for h in self.accountant.history],
            "generator": self.generator.get_state(),
            "sampling_seed": self._draws,
            "settings": self._settings(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict()`` returned.

        Settings other than the checkpoint's (another ``clip``, ``noise``, sampling rate...)
        warn, naming both: ε stays right — the accountant's history holds each round's σ
        and rate, and a noiseless round makes ε infinite — but a resumed loop built with
        other settings is usually a mistake; build it with the checkpoint's, or keep the
        new ones on purpose (a schedule of σ).
        """
        saved = state.get("settings")
        if saved is None and state["history"]:  # (a state from before it held them)
            noise, rate = state["history"][-1][:2]
            saved = {"noise": float(noise), "sample_rate": float(rate)}
        if said := _other_settings(saved or {}, self._settings()):
            warnings.warn(said, stacklevel=outside())
        self.rounds = int(state["rounds"])
        self.accountant.history = [tuple(h) for h in state["history"]]
        self.generator.set_state(state["generator"])
        if "sampling_seed" in state:  # (a state from before it held one: this object's)
            self._draws = int(state["sampling_seed"])
