"""What ``st.remember`` keys a torch argument by: a ``TensorDataset`` by its tensors, a
``Subset`` by its dataset and rows; a module, graph or node is refused, naming the fix."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import ValueConversionError
from ..graph import Graph
from ..node import Node

__all__ = ["adapt"]


class _SubsetKey(NamedTuple):
    """What a ``Subset`` is keyed by: its dataset's content and its rows, in order."""

    dataset: Any
    indices: torch.Tensor


def adapt(value: Any, where: str) -> Any:
    """Torch objects that are data by content (a TensorDataset), or an error with the fix."""
    from torch.utils.data import Subset, TensorDataset

    if isinstance(value, TensorDataset):
        return {"TensorDataset": list(value.tensors)}
    if isinstance(value, Subset):  # a client's or a fold's rows: Subset(train_ds, parts[c])
        picked = value.indices
        rows = torch.as_tensor(list(picked) if isinstance(picked, range) else picked)
        # (its dataset keyed in turn, or refused by name)
        return _SubsetKey(value.dataset, rows.to(torch.int64))
    if isinstance(value, (nn.Module, Graph, Node)):
        name = where.split("'")[1] if "'" in where else where
        raise ValueConversionError(
            f"{where} is a {type(value).__qualname__}, which cannot enter the run's key (its "
            "code is not keyed by content); build it inside the function and pass its state "
            f"(st.state(g) or module.state_dict()) — or, if it does not change the result, "
            f"leave it out of the key explicitly: st.remember(fn, keeper=..., "
            f"exclude=({name!r},)); runs that differ only in it then share one key"
        )
    return NotImplemented
