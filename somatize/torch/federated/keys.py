"""Which keys of a state are what: buffers named by the user, keys that look like BatchNorm's
running statistics, keys kept local (``exclude=``, FedBN), and the checks every aggregator
makes of the names it is given.

A state dict does not say which of its tensors are parameters and which are buffers
(``st.state(g)`` is ``module(g).state_dict()``, both mixed); only the graph knows
(``st.module(g).named_buffers()``). So the user names them, and a float key named as
BatchNorm names its statistics is caught where treating it as a weight would be wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from ...errors import AggregationError
from ...graph import Graph
from ..module import module as graph_module

__all__ = ["batchnorm_keys"]

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


Exclude = Iterable[str] | Callable[[str], bool] | None
_WILD = frozenset("*?[")


def _rule(exclude: Exclude) -> Exclude:
    """``exclude`` checked and kept: a predicate as it is, names and patterns as a tuple (a
    generator would be spent by the first round)."""
    if exclude is None or callable(exclude):
        return exclude
    if isinstance(exclude, str):
        raise TypeError(
            f"exclude is a list of keys or patterns (or a predicate), not the string "
            f"{exclude!r}; pass [{exclude!r}]"
        )
    if not isinstance(exclude, Iterable):
        raise TypeError(
            f"exclude is a list of keys or patterns (or a predicate key -> bool), not "
            f"{exclude!r:.60}; e.g. exclude=['head.*'] keeps the head's keys local"
        )
    out = tuple(exclude)
    for p in out:
        if not isinstance(p, str):
            raise TypeError(
                f"exclude holds {p!r}, a {type(p).__qualname__}: give key names, patterns "
                "such as '*.bn.*', or one predicate key -> bool"
            )
    return out


def _local(
    exclude: Exclude, keys: Collection[str], what: str = "the clients' states"
) -> frozenset[str]:
    """The keys ``exclude`` names among ``keys``: exact names, ``fnmatch`` patterns
    (``"*.bn.*"``) or a predicate ``key -> bool``. A name or pattern that matches nothing is
    an error (a typo would otherwise leave the key averaged)."""
    exclude = _rule(exclude)
    if exclude is None:
        return frozenset()
    if callable(exclude):
        return frozenset(k for k in keys if exclude(k))
    out: set[str] = set()
    for p in exclude:
        hit = [k for k in keys if fnmatchcase(k, p)] if _WILD & set(p) else [p] * (p in keys)
        if not hit:
            raise AggregationError(
                f"exclude={p!r} matches no key of {what} (they look like {list(keys)[:3]}); "
                "name keys as st.state(g) does, or use a pattern such as '*.bn.*' "
                "(clients that leave their local keys out of what they return need no exclude=)"
            )
        out.update(hit)
    return frozenset(out)


def _without(states: list[Mapping[str, torch.Tensor]], local: frozenset[str]) -> list[Any]:
    """Each state without the ``local`` keys (the states themselves when there are none)."""
    if not local:
        return states
    return [{k: t for k, t in s.items() if k not in local} for s in states]


def batchnorm_keys(g: Graph | nn.Module) -> list[str]:
    """The state keys of every BatchNorm layer of ``g`` (a graph, or a module): what FedBN
    keeps on the clients — the affine weight and bias, the running statistics and the count.

    Pass them as ``exclude=`` to ``fedavg``, the robust rules, the server optimizers and
    ``DPFedAvg`` (Li et al. 2021, "FedBN: Federated Learning on Non-IID Features via Local
    Batch Normalization").

    Example:
        >>> batchnorm_keys(nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)))
        ['1.weight', '1.bias', '1.running_mean', '1.running_var', '1.num_batches_tracked']
    """
    m = g if isinstance(g, nn.Module) else graph_module(g)
    return [
        f"{name}.{k}" if name else k
        for name, layer in m.named_modules(remove_duplicate=False)  # as state_dict() names them
        if isinstance(layer, nn.modules.batchnorm._BatchNorm)
        for k in layer.state_dict()
    ]


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t``, or an exact float32 copy of a 1-byte float (``float8_e4m3fn`` and the other
    float8 types), for which torch implements neither ``equal`` nor (for most of them)
    ``isfinite``."""
    return t.to(torch.float32) if t.dtype.itemsize == 1 and t.is_floating_point() else t


def _unchanged(
    global_state: Mapping[str, torch.Tensor], states: list[Any], keys: Iterable[str]
) -> list[str]:
    """The ``keys`` every state holds exactly as the global state does while others moved: a
    frozen backbone's, which no client can move (the server then noises them for nothing).
    A round in which nothing moved at all says nothing of the kind: none."""
    keys = list(keys)
    same = [
        k for k in keys if all(torch.equal(_wide(s[k]), _wide(global_state[k])) for s in states)
    ]
    return same if states and len(same) < len(keys) else []


def _unchanged_warning(rule: str, keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:4]) + (f", ... ({len(keys)} keys)" * (len(keys) > 4))
    return (
        f"{rule}: [{shown}] came back unchanged from every client (a frozen backbone?), and "
        "are noised like the trained keys: the global state's copy of them drifts by noise "
        "every round, and a cache keyed by their weights misses every round. Keep them as "
        f"the global state's with {rule}(..., exclude=[...]) — e.g. exclude=['enc.*'] for a "
        "frozen node 'enc' — and send the clients the same state"
    )
