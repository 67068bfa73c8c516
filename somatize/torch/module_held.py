"""What a module holds besides tensors and plain settings, as it enters its fingerprint.

A module's attribute that is neither a number nor a tensor (a numpy array or float, a
function, a list of tensors, a config) and each of its forward hooks enter as a node's
own attribute enters its state (``node_state``), through the codecs of the graph keying
it (``TensorCodec.held_codecs``: a numpy array or scalar by its bytes) — read at every
key, not once per process.
"""

from __future__ import annotations

import threading
import types
from typing import TYPE_CHECKING, Any

import torch
from blake3 import blake3
from torch import nn

from ..node_state import Codes, _state_part
from ..values import digest as digest_data

if TYPE_CHECKING:
    from .codecs import TensorCodec

__all__ = ["hooks_of", "other_setting"]

_SETTING = frozenset({int, float, bool, str, type(None)})


def other_setting(v: Any, codec: TensorCodec, mod: nn.Module, name: str) -> Any:
    """How ``mod``'s attribute ``name``, ``v`` (neither a number nor a tensor), enters."""
    if isinstance(v, tuple):  # kernel_size, stride (a torch.Size too): item by item
        return tuple(x if type(x) in _SETTING else other_setting(x, codec, mod, name) for x in v)
    if isinstance(v, torch.Tensor):  # (inside a tuple)
        from .tensor_keys import tensor_bytes as _tensor_bytes

        return f"tensor:{tuple(v.shape)}:{v.dtype}:{blake3(_tensor_bytes(v)).hexdigest()}"
    if isinstance(v, torch.Generator):  # a module drawing from its own: where it stands
        return f"generator:{blake3(v.get_state().numpy().tobytes()).hexdigest()}"
    return _held(v, codec, type(mod))


def _held(v: Any, codec: TensorCodec, owner: type) -> Any:
    """A module's attribute or hook that is neither a number nor a tensor, as a node's own
    attribute enters its state (``node_state``): code by its code and what it reads (a
    global rebound, a closure, a tensor it reads changed in place), a list or dict of
    tensors or modules item by item, a numpy array or scalar by its bytes, a ``Fraction``
    or ``Decimal`` by its value, a ``partial`` by its function and arguments, a bound
    method by its function and its object, a config by its attributes — read at every
    key, not once per process. What none of these reads (a lock) enters by its type, and
    warns once, naming the module's class (``owner``)."""
    codes: Codes = codec._held_codes()
    if isinstance(v, (types.FunctionType, type)) or (
        isinstance(v, types.BuiltinFunctionType)
        and (v.__self__ is None or isinstance(v.__self__, (types.ModuleType, type)))
    ):
        return codes(v)  # (TransformerEncoderLayer.activation: its code, memoised)
    depth = getattr(_DEPTH, "n", 0)
    if depth > 8:  # (a module holding itself in a list: its own fingerprint again, and so on)
        return f"deep:{type(v).__qualname__}"
    _DEPTH.n = depth + 1
    codes.owner, codes.what = owner, "module class"
    try:
        return "held:" + digest_data(_state_part(v, codes), (), "a module attribute")
    finally:
        _DEPTH.n = depth


_DEPTH = threading.local()


def hooks_of(codec: TensorCodec, mod: nn.Module | None, *tables: Any) -> tuple[Any, ...]:
    """The forward hooks registered in ``tables`` (each hook changes outputs) — ``mod``'s,
    or torch's global ones (None) —, each by its code and what it reads, at every key."""
    owner = nn.Module if mod is None else type(mod)
    return tuple(_held(h, codec, owner) for table in tables for h in table.values())
