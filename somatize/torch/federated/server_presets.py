"""The server optimizers by name (Reddi et al. 2021, Hsu et al. 2019): ``FedAvgM``,
``FedAdam``, ``FedYogi``, ``FedAdagrad`` — each a ``ServerOptimizer`` (``server.py``)."""

from __future__ import annotations

from collections.abc import Iterable

from .keys import Exclude, _names
from .server import ServerOptimizer

__all__ = ["FedAdagrad", "FedAdam", "FedAvgM", "FedYogi"]


def FedAvgM(
    *,
    lr: float = 1.0,
    momentum: float = 0.9,
    buffers: Iterable[str] = (),
    exclude: Exclude = None,
) -> ServerOptimizer:
    """Server momentum (Hsu et al. 2019): v ← βv + Δ; x ← x + ηv. ``lr=1, momentum=0`` is FedAvg."""
    return ServerOptimizer(
        "avgm", lr, beta1=momentum, buffers=_names("buffers", buffers), exclude=exclude
    )


def FedAdam(
    *,
    lr: float = 1e-2,
    beta1: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
    buffers: Iterable[str] = (),
    exclude: Exclude = None,
) -> ServerOptimizer:
    """FedAdam: m ← β₁m + (1−β₁)Δ; v ← β₂v + (1−β₂)Δ²; x ← x + η m / (√v + τ)."""
    return ServerOptimizer(
        "adam", lr, beta1, beta2, tau, buffers=_names("buffers", buffers), exclude=exclude
    )


def FedYogi(
    *,
    lr: float = 1e-2,
    beta1: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
    buffers: Iterable[str] = (),
    exclude: Exclude = None,
) -> ServerOptimizer:
    """FedYogi: as FedAdam, with v ← v − (1−β₂)Δ² sign(v − Δ²)."""
    return ServerOptimizer(
        "yogi", lr, beta1, beta2, tau, buffers=_names("buffers", buffers), exclude=exclude
    )


def FedAdagrad(
    *,
    lr: float = 1e-2,
    beta1: float = 0.0,
    tau: float = 1e-3,
    buffers: Iterable[str] = (),
    exclude: Exclude = None,
) -> ServerOptimizer:
    """FedAdagrad: m ← β₁m + (1−β₁)Δ; v ← v + Δ²; x ← x + η m / (√v + τ)."""
    return ServerOptimizer(
        "adagrad", lr, beta1, tau=tau, buffers=_names("buffers", buffers), exclude=exclude
    )
