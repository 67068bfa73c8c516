"""A ``Graph`` used as the ``nn.Module`` it is not — ``g(x)``, ``g.parameters()``,
``g.to("cuda")`` — is told what to write instead: ``g.forward(x)``, or ``st.module(g)``
(``somatize.torch``), which is one. ``Graph`` takes ``called`` as its ``__call__``, and
``install`` gives it one attribute per ``nn.Module`` method it lacks, whose every read
raises that ``AttributeError`` (so ``hasattr`` stays False). Not a ``__getattr__``: a
class with one gets CPython's slow attribute lookup for *every* attribute (its reads are
not specialised), which made building a 1,000-node graph 15-30% slower."""

from __future__ import annotations

from typing import Any

__all__ = ["called", "install"]

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


class _NotModule:
    """An ``nn.Module`` method's name on ``Graph``: reading it raises the error naming
    ``st.module(g)`` (on the class too, so that it is no member anyone lists)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        name = self.name
        raise AttributeError(
            f"'Graph' object has no {name}() — a Graph is not an nn.Module; "
            f"st.module(g) (somatize.torch) is: st.module(g).{name}(...)"
            + (", or st.parameters(g) for an optimizer" if name == "parameters" else "")
        )


def install(cls: type) -> None:
    """Give ``cls`` (``Graph``) a ``_NotModule`` for each ``nn.Module`` method it lacks."""
    for name in _MODULE_METHODS:
        if not any(name in vars(c) for c in cls.__mro__):
            setattr(cls, name, _NotModule(name))
