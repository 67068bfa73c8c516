"""Which keys of a state are what: buffers named by the user, keys that look like BatchNorm's
running statistics, and the checks every aggregator makes of the names it is given.

A state dict does not say which of its tensors are parameters and which are buffers
(``st.state(g)`` is ``module(g).state_dict()``, both mixed); only the graph knows
(``st.module(g).named_buffers()``). So the user names them, and a float key named as
BatchNorm names its statistics is caught where treating it as a weight would be wrong.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import torch

from ...errors import AggregationError

__all__: list[str] = []

STATISTICS = ("running_mean", "running_var")  # BatchNorm's float buffers, by their last name
NAME_BUFFERS = "buffers=[k for k, _ in st.module(g).named_buffers()]"


def _names(name: str, value: Iterable[str]) -> frozenset[str]:
    """``value`` as a set of key names (a lone string is refused: it iterates as letters)."""
    if isinstance(value, str):
        raise TypeError(f"{name} is a list of keys, not the string {value!r}; pass [{value!r}]")
    out = frozenset(value)
    bad = next((k for k in out if not isinstance(k, str)), None)
    if bad is not None:
        raise TypeError(f"{name} holds {bad!r}, a {type(bad).__qualname__}: keys are strings")
    return out


def _unknown(name: str, named: Collection[str], state: Mapping[str, torch.Tensor]) -> None:
    """An ``AggregationError`` if ``named`` holds a key the state does not."""
    unknown = sorted(set(named) - state.keys())
    if unknown:
        raise AggregationError(
            f"{name} names keys the state does not hold: {unknown[:5]}; name them as "
            f"st.module(g).named_buffers() does (the state's keys look like {list(state)[:3]})"
        )


def _statistics(state: Mapping[str, torch.Tensor], named: Collection[str]) -> list[str]:
    """Float keys not in ``named`` whose last name is one of BatchNorm's running statistics."""
    return [
        k
        for k, t in state.items()
        if k not in named and t.is_floating_point() and k.rsplit(".", 1)[-1] in STATISTICS
    ]
