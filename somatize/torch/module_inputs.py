"""How ``GraphModule.forward`` takes its arguments, and when it cannot key them: under a
trace, an export or a ``torch.func`` transform, whose tensors have no bytes to read."""

from __future__ import annotations

from typing import Any

import torch

from ..values import Opaque
from .frozen import needs_grad

__all__ = ["as_input", "recording"]


def as_input(a: Any, as_data: bool) -> Any:
    """An argument of ``GraphModule.forward`` as the graph takes it: a tensor Opaque (data
    where a cached graph keys it and it needs no grad); a tuple, list or dict holding a
    tensor that requires grad Opaque as a whole (input gradients of a multimodal batch);
    anything else data."""
    if isinstance(a, torch.Tensor):
        return a if as_data and not a.requires_grad else Opaque(a)
    return Opaque(a) if needs_grad(a) else a


def _transformed() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``) runs this call:
    its tensors are wrappers, with no bytes to key."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def _is_tracing() -> bool:
    """Whether ``torch.jit.trace`` is recording (``torch.jit.is_tracing``, untyped)."""
    return bool(torch.jit.is_tracing())  # type: ignore[attr-defined,no-untyped-call]


def recording() -> bool:
    """Whether this call is recorded (``torch.jit.trace``, ``torch.export``) or transformed
    (``torch.func``), rather than run: a cache cannot look its inputs up then."""
    return _is_tracing() or torch.compiler.is_exporting() or _transformed()
