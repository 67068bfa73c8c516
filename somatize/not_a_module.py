"""A ``Graph`` used as the ``nn.Module`` it is not — ``g(x)``, ``g.parameters()``,
``g.to("cuda")`` — is told what to write instead: ``g.forward(x)``, or ``st.module(g)``
(``somatize.torch``), which is one. ``Graph`` takes these two functions as its
``__call__`` and ``__getattr__`` (the latter asked only for names it lacks)."""

from __future__ import annotations

from typing import Any

__all__ = ["called", "missing"]

#: nn.Module's methods a PyTorch user reaches for on the graph instead of st.module(g).
_MODULE_METHODS = frozenset(
    [
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "modules",
        "children",
        "state_dict",
        "load_state_dict",
        "to",
        "cuda",
        "cpu",
        "half",
        "float",
        "double",
        "train",
        "eval",
        "zero_grad",
        "requires_grad_",
        "apply",
        "register_forward_hook",
        "register_buffer",
    ]
)


def called(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(
        "a Graph is not called: g.forward(x) runs it; for tensors and training, "
        "model = st.module(g) (somatize.torch) is the nn.Module to call, model(x)"
    )


def missing(self: Any, name: str) -> Any:
    # only for names the instance and class lack: nn.Module's, used on the graph itself
    if name in _MODULE_METHODS:
        raise AttributeError(
            f"'Graph' object has no {name}() — a Graph is not an nn.Module; "
            f"st.module(g) (somatize.torch) is: st.module(g).{name}(...)"
            + (", or st.parameters(g) for an optimizer" if name == "parameters" else "")
        )
    raise AttributeError(f"'Graph' object has no attribute {name!r}")
