"""Server optimizers (Reddi et al. 2021, "Adaptive Federated Optimization"): FedAvgM,
FedAdam, FedYogi, FedAdagrad.

The aggregate of a round minus the global state is a *pseudo-gradient* Δ; a server
optimizer turns it into the next global state::

    server = fl.FedAdam(lr=1e-2)
    for r in range(rounds):
        ...
        global_state = server.step(global_state, st.fedavg(results))

Everything is matched by name and computed in float64; moments are kept in float64
and each result is cast back to the global tensor's dtype. Integer tensors
(counters) are taken from the aggregate as they are, and so are the keys named in
``buffers=`` (BatchNorm's running statistics). ``state_dict()`` /
``load_state_dict()`` checkpoint the moments and the step count, so a resumed loop
continues bitwise.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from ...errors import AggregationError
from ...stack import outside
from ..result import TrainResult
from .keys import NAME_BUFFERS, Exclude, _local, _names, _rule, _statistics, _unknown, _wide

__all__ = ["ServerOptimizer"]

Rule = Literal["avgm", "adam", "yogi", "adagrad"]
_MAKER = {
    "avgm": "fl.FedAvgM",
    "adam": "fl.FedAdam",
    "yogi": "fl.FedYogi",
    "adagrad": "fl.FedAdagrad",
}
# the hyper-parameters each rule's update reads (state_dict() saves them all)
_USES = {
    "avgm": ("lr", "beta1"),
    "adam": ("lr", "beta1", "beta2", "tau"),
    "yogi": ("lr", "beta1", "beta2", "tau"),
    "adagrad": ("lr", "beta1", "tau"),
}


def _check_state(name: str, value: Any) -> None:
    """``value`` is a state dict of tensors (a mistake here used to end in AttributeError)."""
    fix = (
        "pass the global state dict and st.fedavg(results): "
        "global_state = server.step(global_state, st.fedavg(results))"
    )
    if isinstance(value, TrainResult):
        raise TypeError(f"{name} is a TrainResult, not a state dict (its .state is one); {fix}")
    if not isinstance(value, Mapping):
        hint = " (the clients' results?)" if isinstance(value, (list, tuple)) else ""
        raise TypeError(f"{name} is a {type(value).__qualname__}{hint}, not a state dict; {fix}")
    for k, t in value.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{name}[{k!r}] is a {type(t).__qualname__}, not a tensor: a state dict maps "
                f"names to tensors; {fix}"
            )


def _is_aggregate(value: Any) -> bool:
    """An ``Aggregate``, or one that crossed a pickle (an ``OrderedDict`` with its attributes)."""
    return isinstance(value, Mapping) and hasattr(value, "weights") and hasattr(value, "excluded")


def _real(value: Any) -> bool:
    """A real number — numpy's scalars too (``np.float32(0.1)``) — and not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _decay(name: str, value: Any) -> float:
    """A decay rate or momentum in [0, 1), as a Python float."""
    if not (_real(value) and 0 <= value < 1):
        raise ValueError(f"{name} must be in [0, 1), not {value!r}")
    return float(value)


@dataclass(repr=False)
class ServerOptimizer:
    """One of Reddi et al.'s server updates; make one with ``FedAdam(...)`` and friends.

    Attributes:
        rule: ``"avgm"``, ``"adam"``, ``"yogi"`` or ``"adagrad"``.
        lr: the server learning rate η.
        beta1: momentum (β for FedAvgM, which reads and sets it as ``momentum``).
        beta2: second-moment decay (FedAdam, FedYogi).
        tau: adaptivity τ: the second moment starts at τ², and √v + τ divides.
        steps: rounds taken so far.
        buffers: keys taken from the aggregate as they are, not moved by the rule: a
            model's buffers (BatchNorm's running statistics are averages, not weights:
            Adam's step would move ``running_var`` by about ``lr`` a round whatever its
            scale). ``[k for k, _ in st.module(g).named_buffers()]`` names them.
        exclude: keys the clients keep local (FedBN: ``fl.batchnorm_keys(g)``), as in
            ``fedavg``: names, ``fnmatch`` patterns or a predicate. The global state's
            values are kept, and the aggregate may leave them out (``fedavg(exclude=)`` does).
    """

    rule: Rule
    lr: float
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    steps: int = 0
    buffers: frozenset[str] = frozenset()
    exclude: Exclude = None
    m: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    v: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.rule not in ("avgm", "adam", "yogi", "adagrad"):
            raise ValueError(f"rule must be avgm, adam, yogi or adagrad, not {self.rule!r}")
        for name in ("lr", "tau"):
            value = getattr(self, name)
            if not (_real(value) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, not {value!r}")
            setattr(self, name, float(value))  # (numpy's scalars too, as Python floats)
        for name in ("beta1", "beta2"):
            setattr(self, name, _decay(self._called(name), getattr(self, name)))
        self.buffers = _names("buffers", self.buffers)
        self.exclude = _rule(self.exclude)
        self._warned = False

    def __repr__(self) -> str:
        """Its maker's name with the hyper-parameters its rule reads and the rounds taken:
        ``fl.FedAvgM(lr=1.0, momentum=0.9, steps=0)``, not the beta2 and tau it never uses."""
        shown = [f"{self._called(k)}={getattr(self, k)!r}" for k in _USES[self.rule]]
        shown.append(f"steps={self.steps}")
        if self.buffers:
            shown.append(f"buffers={sorted(self.buffers)!r}")
        if self.exclude is not None:
            shown.append(f"exclude={self.exclude!r}")
        return f"{_MAKER[self.rule]}({', '.join(shown)})"

    def _called(self, name: str) -> str:
        """What the maker calls a hyper-parameter: FedAvgM's ``beta1`` is its ``momentum``."""
        return "momentum" if (self.rule, name) == ("avgm", "beta1") else name

    @property
    def momentum(self) -> float:
        """FedAvgM's momentum β (kept as ``beta1``); set it to go on with another."""
        if self.rule != "avgm":
            raise AttributeError(self._no_momentum())
        return self.beta1

    @momentum.setter
    def momentum(self, value: float) -> None:
        if self.rule != "avgm":
            raise AttributeError(self._no_momentum())
        self.beta1 = _decay("momentum", value)

    def _no_momentum(self) -> str:
        return (
            f"{_MAKER[self.rule][3:]} has no momentum: its first-moment decay is beta1 "
            f"(server.beta1 = ...); momentum is FedAvgM's"
        )

    def step(
        self, global_state: Mapping[str, torch.Tensor], aggregate: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The next global state from this round's aggregate (``fedavg`` of the clients).

        Raises:
            TypeError: either argument is not a state dict of tensors (a list of results,
                a ``TrainResult``): pass the global state and ``st.fedavg(results)``; or
                they are swapped (an ``Aggregate`` first, a plain state dict second).
            AggregationError: their keys, or a key's shape or dtype, differ (the keys
                ``exclude`` names may be missing from the aggregate: one that leaves out the
                keys its aggregator's ``exclude=`` kept local needs the same ``exclude=``
                here); a float key holds NaN
                or inf (nothing is stepped: the moments would keep it for every round).
        """
        self._check_order(global_state, aggregate)
        _check_state("global_state", global_state)
        _check_state("aggregate", aggregate)
        local = _local(self.exclude, global_state.keys(), "the global state")
        if global_state.keys() - local != aggregate.keys() - local or not (
            aggregate.keys() <= global_state.keys()
        ):
            raise self._differ(global_state, aggregate, local)
        _unknown("buffers", self.buffers, global_state)
        self._warn_statistics(global_state, local)
        out: dict[str, torch.Tensor] = {}
        b1, b2 = self.beta1, self.beta2
        moved_m: dict[str, torch.Tensor] = {}  # (kept only once every key has stepped: a
        moved_v: dict[str, torch.Tensor] = {}  # step refused on a later key changes nothing)
        with torch.no_grad():
            for k, x in global_state.items():
                if k in local:  # the clients' own: the server keeps its value
                    out[k] = x.detach().clone()
                    continue
                a = aggregate[k]
                if a.shape != x.shape or a.dtype != x.dtype:
                    raise AggregationError(
                        f"key {k!r}: the aggregate is {a.dtype} {tuple(a.shape)}, the global "
                        f"state {x.dtype} {tuple(x.shape)}; they must match"
                    )
                if x.is_floating_point():
                    self._check_finite(k, x, a)
                if not x.is_floating_point() or k in self.buffers:
                    out[k] = a.detach().clone()
                    continue
                x64 = x.detach().to(torch.float64)
                delta = a.detach().to(torch.float64) - x64  # the pseudo-gradient
                m = self.m.get(k)
                if m is None:
                    m = torch.zeros_like(x64)
                elif m.shape != x64.shape:
                    raise AggregationError(
                        f"key {k!r} is {tuple(x64.shape)} now, but this server optimizer's "
                        f"moments were made for {tuple(m.shape)}: it keeps them across rounds "
                        f"of one model; make a fresh one ({_MAKER[self.rule]}(...)) for "
                        "another model, or load_state_dict the one this model's run saved"
                    )
                if self.rule == "avgm":  # Hsu et al. 2019: v ← βv + Δ; x ← x + ηv
                    m = b1 * m + delta
                    out[k] = (x64 + self.lr * m).to(x.dtype)
                    moved_m[k] = m
                    continue
                m = b1 * m + (1 - b1) * delta
                v = self.v.get(k)
                if v is None:
                    v = torch.full_like(x64, self.tau**2)
                sq = delta * delta
                if self.rule == "adagrad":
                    v = v + sq
                elif self.rule == "yogi":
                    v = v - (1 - b2) * sq * torch.sign(v - sq)
                else:
                    v = b2 * v + (1 - b2) * sq
                out[k] = (x64 + self.lr * m / (v.sqrt() + self.tau)).to(x.dtype)
                moved_m[k], moved_v[k] = m, v
        self.m.update(moved_m)
        self.v.update(moved_v)
        self.steps += 1
        return out

    def _check_order(self, global_state: Any, aggregate: Any) -> None:
        """A ``TypeError`` for ``step(aggregate, global_state)``: swapped, the step would
        silently move the state backwards (FedAvgM at lr=1 gives back the old global state)."""
        if _is_aggregate(global_state) and not _is_aggregate(aggregate):
            raise TypeError(
                f"{_MAKER[self.rule]}.step got an Aggregate (st.fedavg's result) as its first "
                "argument and a plain state dict as its second: the order is "
                "step(global_state, aggregate), and swapped the step goes backwards — write "
                "global_state = server.step(global_state, st.fedavg(results)). (If the global "
                "state really is an earlier round's aggregate, pass dict(global_state).)"
            )

    def _differ(
        self,
        global_state: Mapping[str, torch.Tensor],
        aggregate: Mapping[str, torch.Tensor],
        local: frozenset[str],
    ) -> AggregationError:
        """The error for key sets that differ: where the aggregate left out the keys
        ``exclude=`` kept on the clients (FedBN), the fix is this optimizer's ``exclude=``."""
        diff = sorted((set(global_state) ^ set(aggregate)) - local)
        missing = set(global_state) - set(aggregate) - local
        excluded = set(getattr(aggregate, "excluded", ()) or ())
        if missing and missing <= excluded and aggregate.keys() <= global_state.keys():
            more = f" ({len(missing)} in all)" if len(missing) > 5 else ""
            return AggregationError(
                f"the aggregate leaves out keys {sorted(missing)[:5]}{more}, which the "
                "aggregator's exclude= kept on the clients (Aggregate.excluded lists them), but "
                f"this {_MAKER[self.rule]} was built without them in its own exclude=: build the server optimizer with the same exclude= as the aggregator "
                f"— {_MAKER[self.rule]}(..., exclude=bn) for st.fedavg(results, exclude=bn) "
                "— and it keeps the global state's values of those keys"
            )
        hint = ""
        if missing and aggregate.keys() <= global_state.keys():
            hint = (
                " (if the clients keep those keys local, as FedBN does: build the server "
                f"optimizer with the aggregator's exclude=, {_MAKER[self.rule]}(..., exclude=...))"
            )
        return AggregationError(
            f"the aggregate and the global state differ in keys {diff[:5]}; step the global "
            f"state the clients started from with the aggregate of their results{hint}"
        )

    def _check_finite(self, k: str, x: torch.Tensor, a: torch.Tensor) -> None:
        """An ``AggregationError`` if the aggregate's (or the global state's) ``k`` holds NaN
        or inf: stepped, it would stay in the moments, and the state, for every later round."""
        for name, t in (("the aggregate", a), ("the global state", x)):
            if not bool(torch.isfinite(_wide(t)).all()):
                raise AggregationError(
                    f"key {k!r}: {name} holds NaN or inf, which {_MAKER[self.rule]}'s step "
                    "would carry into the global state and its moments for every later round; "
                    "nothing was stepped — aggregate only finite client updates (st.fedavg "
                    "refuses NaN by default; nonfinite='skip' leaves such clients out)"
                )

    def _warn_statistics(self, state: Mapping[str, torch.Tensor], local: frozenset[str]) -> None:
        """Once: float keys named as BatchNorm's statistics, which the rule would move."""
        if self._warned:
            return
        moved = _statistics(state, self.buffers | local)
        if moved:
            self._warned = True
            warnings.warn(
                f"{moved[0]!r} (and {len(moved) - 1} more) look like BatchNorm running "
                f"statistics, which the {self.rule} rule moves as if they were weights; pass "
                f"{NAME_BUFFERS} to take them from the aggregate as they are",
                UserWarning,
                stacklevel=outside(),
            )

    def state_dict(self) -> dict[str, Any]:
        """The hyper-parameters, moments and step count (tensors and numbers: ``torch.save``
        them, and ``torch.load`` with ``weights_only=True``)."""
        return {
            "rule": self.rule,
            "lr": self.lr,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "tau": self.tau,
            "steps": self.steps,
            "m": {k: t.clone() for k, t in self.m.items()},
            "v": {k: t.clone() for k, t in self.v.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict()`` returned.

        As the Trainer does for an optimizer on resume, a hyper-parameter that differs from
        this optimizer's warns, naming both values, and the checkpoint's is kept, so that
        the loop resumes exactly; set the attribute afterwards (``server.lr = 0.1``) to go
        on with the new value. (A state saved before the hyper-parameters were, has none.)

        Raises:
            ValueError: not a server optimizer's state, or another rule's.
        """
        missing = {"rule", "steps", "m", "v"} - set(state)
        if missing:
            raise ValueError(
                f"not a server optimizer state: missing {sorted(missing)}; pass what a server "
                "optimizer's state_dict() returned"
            )
        if state["rule"] != self.rule:
            raise ValueError(
                f"this state is of a {state['rule']!r} server optimizer, not {self.rule!r}; load "
                f"it into {_MAKER.get(str(state['rule']), 'the optimizer that wrote it')}(...)"
            )
        saved = {k: state[k] for k in ("lr", "beta1", "beta2", "tau") if k in state}
        try:  # the checkpoint's values, checked as the constructor checks them
            replace(self, m={}, v={}, **saved)
        except ValueError as e:
            raise ValueError(f"the checkpoint's server optimizer state is invalid: {e}") from e
        for k in _USES[self.rule]:
            if k in saved and saved[k] != getattr(self, k):
                name = self._called(k)
                warnings.warn(
                    f"server optimizer hyper-parameter {name!r} changed: the checkpoint has "
                    f"{saved[k]!r}, this {self.rule!r} optimizer {getattr(self, k)!r}; the "
                    f"checkpoint's value is kept so the loop resumes exactly (set server.{name} "
                    f"= {getattr(self, k)!r} after load_state_dict to go on with the new value)",
                    UserWarning,
                    stacklevel=outside(),
                )
        for k, value in saved.items():
            setattr(self, k, value)
        self.steps = int(state["steps"])
        self.m = {k: t.clone() for k, t in state["m"].items()}
        self.v = {k: t.clone() for k, t in state["v"].items()}
