"""A ``Graph`` used as the ``nn.Module`` it is not — ``g(x)``, ``g.parameters()``,
``g.to("cuda")`` — is told what to write instead: ``g.forward(x)``, or ``st.module(g)``
(``somatize.torch``), which is one. ``Graph`` takes ``called`` as its ``__call__``, and
``install`` gives it one attribute per ``nn.Module`` method it lacks, whose every read
raises that ``AttributeError`` (so ``hasattr`` stays False). Not a ``__getattr__``: a
class with one gets CPython's slow attribute lookup for *every* attribute (its reads are
not specialised), which made building a 1,000-node graph 15-30% slower."""

from __future__ import annotations

from typing import Any

__all__ = ["Refused", "called", "install"]

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


class Refused:
    """A name a class answers with an ``AttributeError`` saying what to write instead, on
    the class too (``hasattr`` stays False, and no one lists it as a member). A descriptor
    per name, where a ``__getattr__`` would slow every other attribute read of the class."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        raise AttributeError(self.message)


def install(cls: type) -> None:
    """Give ``cls`` (``Graph``) a ``Refused`` for each ``nn.Module`` method it lacks."""
    for name in _MODULE_METHODS:
        if not any(name in vars(c) for c in cls.__mro__):
            said = ", or st.parameters(g) for an optimizer" if name == "parameters" else ""
            setattr(
                cls,
                name,
                Refused(
                    f"'Graph' object has no {name}() — a Graph is not an nn.Module; "
                    f"st.module(g) (somatize.torch) is: st.module(g).{name}(...){said}"
                ),
            )
