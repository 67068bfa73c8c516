"""Client-side corrections without rewriting the loss: FedProx and SCAFFOLD.

Both wrap the Trainer's optimizer factory. The wrapped optimizer gets a step
pre-hook (``Optimizer.register_step_pre_hook``) that adds a term to each gradient
just before the update, after backward (and after gradient clipping and AMP
unscaling), so the loss, the graph and the Trainer stay as they are. A step given a
closure (``LBFGS``, which evaluates it many times a step; Lightning, whose closure
computes the gradients afresh) gets its closure wrapped instead: the term is added
after each of its backward passes, and its loss to the loss the closure returns::

    trainer = st.Trainer(loss=..., optimizer=fl.prox(lambda ps: SGD(ps, lr=0.05), mu=0.01))

* **FedProx** (Li et al. 2020) adds μ(w − w_global): exactly the gradient of the
  proximal term μ/2‖w − w_global‖². The anchor w_global is the weights the optimizer
  is made over — the global state the client loaded before ``fit``.
* **SCAFFOLD** (Karimireddy et al. 2020) adds c − cᵢ, the server's control variate
  minus the client's. Variates are dicts keyed by parameter name, so the wrapper
  needs the graph to name the parameters it is given.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...errors import AggregationError
from ...graph import Graph
from ..module import module as graph_module

__all__ = ["control_variate", "prox", "scaffold", "server_variate", "variates"]

Factory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
Variates = Mapping[str, torch.Tensor]


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def _on_gradients(
    opt: torch.optim.Optimizer, add: Callable[[], None], value: Callable[[], torch.Tensor]
) -> None:
    """Make every step of ``opt`` see ``add()``'s terms in its gradients.

    A step without a closure: added before it. A step with one (``LBFGS``, which calls it
    again and again; Lightning, whose closure zeroes the gradients and computes them
    afresh): added inside it, after each backward, and ``value()`` — the term's own loss,
    whose gradient ``add`` adds — is added to the loss it returns, so a line search compares
    the losses of the objective whose gradients it is given."""

    def hook(_opt: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # (args are step's own, the optimizer first: step(self, closure=None))
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if closure is None:
            with torch.no_grad():
                add()
            return None

        def wrapped() -> Any:
            loss = closure()
            with torch.no_grad():
                add()
                if loss is None:
                    return None
                extra = value()
            return loss + (extra.to(loss) if isinstance(loss, torch.Tensor) else float(extra))

        if len(args) > 1:
            return (args[0], wrapped, *args[2:]), kwargs
        return args, {**kwargs, "closure": wrapped}

    opt.register_step_pre_hook(hook)


def prox(optimizer: Factory, mu: float) -> Factory:
    """FedProx: an optimizer factory whose steps add μ(w − w₀) to each parameter's gradient.

    w₀ is each parameter's value when the optimizer is made (the Trainer makes it at
    the start of ``fit``, after the client loaded the global state, before any resume).

    Args:
        optimizer: the factory the Trainer would take, ``params -> Optimizer``.
        mu: the proximal weight μ ≥ 0 (0 is FedAvg).

    Example:
        >>> w = nn.Parameter(torch.tensor([1.0]))
        >>> opt = prox(lambda ps: torch.optim.SGD(ps, lr=0.5), mu=1.0)([w])
        >>> with torch.no_grad(): _ = w.add_(2.0)   # the client moved away from w₀ = 1
        >>> w.grad = torch.zeros(1); opt.step(); w   # the proximal pull: 3 - 0.5 * (3 - 1)
        Parameter containing:
        tensor([2.], requires_grad=True)
    """
    if isinstance(mu, bool) or not isinstance(mu, numbers.Real) or not 0 <= mu < math.inf:
        raise ValueError(f"mu must be a non-negative finite number (0 is FedAvg), not {mu!r}")
    mu = float(mu)  # (numpy's scalars too: a float32 mu would round each term to float32)
    if not callable(optimizer):
        raise TypeError(
            "prox wraps an optimizer factory, e.g. prox(lambda ps: SGD(ps, 0.1), mu=0.01)"
        )

    def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        opt = optimizer(params)
        anchors = [(p, p.detach().clone()) for p in _params(opt)]

        def pull() -> None:
            for p, w0 in anchors:
                term = (p - w0).mul_(mu)
                if p.grad is None:
                    p.grad = term
                else:
                    p.grad.add_(term)

        def value() -> torch.Tensor:  # μ/2‖w − w₀‖², whose gradient pull adds
            total = sum(((p - w0).double().pow(2).sum() for p, w0 in anchors), torch.zeros(()))
            return total * (mu / 2)

        _on_gradients(opt, pull, value)
        return opt

    return make


def variates(g: Graph) -> dict[str, torch.Tensor]:
    """Zero control variates, one per trainable parameter of ``g`` (SCAFFOLD's start)."""
    return {
        name: torch.zeros_like(p.detach())
        for name, p in graph_module(g).named_parameters()
        if p.requires_grad
    }


def scaffold(optimizer: Factory, g: Graph, c: Variates, c_client: Variates) -> Factory:
    """SCAFFOLD: an optimizer factory whose steps add c − cᵢ to each parameter's gradient.

    Args:
        optimizer: the factory the Trainer would take (SCAFFOLD's analysis is for SGD).
        g: the client's graph, to name the parameters the Trainer passes.
        c: the server's control variate; ``c_client``: this client's (both by name, one
            entry per trainable parameter, as ``variates(g)`` makes them: a frozen
            parameter has none, and is never corrected).
    """
    named = list(graph_module(g).named_parameters())
    names = {id(p): n for n, p in named}
    # the trainable ones, as fl.variates(g) gives them (a frozen layer has no variate)
    _check_variates(c, c_client, [n for n, p in named if p.requires_grad])

    def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        opt = optimizer(params)
        pairs = []
        held = [p for p in _params(opt) if p.requires_grad]  # a frozen one is never stepped
        for p in held:
            if id(p) not in names:
                raise AggregationError(
                    f"scaffold: the optimizer holds a parameter {tuple(p.shape)} that is not "
                    "one of g's; pass scaffold the graph the Trainer trains (fit(g, ...)), and "
                    "build the optimizer over the parameters the factory is given"
                )
        _check_variates(c, c_client, [names[id(p)] for p in held])
        for p in held:
            n = names[id(p)]
            pairs.append(
                (
                    p,
                    (c[n].to(p.device, torch.float64) - c_client[n].to(p.device, torch.float64)).to(
                        p.dtype
                    ),
                )
            )

        starts = [p.detach().clone() for p, _ in pairs]

        def correct() -> None:
            for p, d in pairs:
                if p.grad is None:
                    p.grad = d.clone()
                else:
                    p.grad.add_(d)

        def value() -> torch.Tensor:  # ⟨c − cᵢ, w − w₀⟩, whose gradient correct adds
            terms = ((d.double() * (p - w0).double()).sum() for (p, d), w0 in zip(pairs, starts))
            return sum(terms, torch.zeros((), dtype=torch.float64))

        _on_gradients(opt, correct, value)
        return opt

    return make


def _check_variates(c: Variates, c_client: Variates, names: Sequence[str]) -> None:
    for label, var in (("c", c), ("c_client", c_client)):
        missing = sorted(n for n in names if n not in var)
        if missing:
            raise AggregationError(
                f"the control variate {label} has no entry for {missing[:5]}; start from "
                "fl.variates(g) and keep one entry per trainable parameter"
            )


def control_variate(
    global_state: Mapping[str, torch.Tensor],
    result: Any,
    c: Variates,
    c_client: Variates,
    *,
    lr: float,
) -> dict[str, torch.Tensor]:
    """The client's new variate, SCAFFOLD's option II: cᵢ⁺ = cᵢ − c + (x − yᵢ) / (K·η).

    Args:
        result: the client's ``TrainResult`` (its ``state`` is yᵢ and ``steps`` is K).
        lr: η, the client's learning rate.
    """
    steps = getattr(result, "steps", None)
    if not steps:
        raise AggregationError(
            "control_variate needs the client's TrainResult with at least one step "
            f"(got {type(result).__qualname__} with steps={steps!r})"
        )
    y = result.state
    return {
        n: (
            c_client[n].to(torch.float64)
            - c[n].to(torch.float64)
            + (global_state[n].to(torch.float64) - y[n].to(torch.float64)) / (steps * lr)
        ).to(c_client[n].dtype)
        for n in c_client
    }


def server_variate(
    c: Variates, deltas: Sequence[Variates], clients: int
) -> dict[str, torch.Tensor]:
    """The server's new variate: c + (1/N)·Σ (cᵢ⁺ − cᵢ) over this round's clients.

    Args:
        deltas: each sampled client's cᵢ⁺ − cᵢ.
        clients: N, how many clients there are in all.
    """
    if not deltas:
        raise AggregationError(
            "no client variates to aggregate: deltas is empty; pass each of this round's "
            "clients' cᵢ⁺ − cᵢ (control_variate's result minus its variate)"
        )
    return {
        n: (c[n].to(torch.float64) + sum(d[n].to(torch.float64) for d in deltas) / clients).to(
            c[n].dtype
        )
        for n in c
    }
