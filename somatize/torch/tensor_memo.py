"""The tensor codec's digest memo: each tensor's digest, with what the tensor was when hashed.

``TensorCodec.digest`` and a module's fingerprint (``fingerprints.py``) serve a tensor's
digest from here while its version counter, data pointer, dtype, shape and strides are as
they were. The memo holds the tensors themselves, keyed by ``id``: a weak reference would
do, and ``torch.utils.swap_tensors`` — what ``nn.Module.to()``, ``.double()`` and
``.cuda()`` do under ``torch.__future__.set_swap_module_params_on_conversion(True)`` —
refuses to swap a tensor that has one. Held, an id here can never be another object's.

Holding a tensor keeps it alive, so the entries of tensors that nothing but the memo holds
are dropped (``prune``) once 4096 entries, or 64 MiB of tensors, were added since the last
pruning: a tensor hashed once (a round's global state, a replaced module's weights)
outlives its last other reference by at most that. ``TensorCodec.forget`` (every
``module(g)``, every ``fit``) drops them all.
"""

from __future__ import annotations

from sys import getrefcount
from typing import Any

import torch

__all__ = ["TensorMemo"]

_RETAIN = 64 << 20  # bytes of tensors added between prunings


class TensorMemo(dict[int, tuple[torch.Tensor, tuple[Any, ...], str]]):
    """id(tensor) -> (the tensor, (version, data_ptr, dtype, shape, stride), its digest).

    A dict, so a reader's ``memo.get(id(t))`` costs what it costs on a plain one."""

    __slots__ = ("_added", "_limit")

    def __init__(self) -> None:
        super().__init__()
        self._limit = 4096  # entries before the next pruning
        self._added = 0  # bytes of the tensors added since the last one

    def keep(self, t: torch.Tensor, seen: tuple[Any, ...], digest: str) -> None:
        """Remember ``t``'s ``digest``, made when ``t`` was as ``seen`` says."""
        if id(t) not in self:  # (a new tensor: once held, an id is never another's)
            self._added += _storage_bytes(t)
            if len(self) >= self._limit or self._added > _RETAIN:
                self.prune()
        self[id(t)] = (t, seen, digest)

    def prune(self) -> None:
        """Drop the entries of tensors that nothing but this memo holds."""
        for key, count in _counts(self):
            if count <= _ALONE:
                del self[key]
        self._limit = max(4096, 2 * len(self))
        self._added = 0

    def clear(self) -> None:
        super().clear()
        self._added = 0


def _counts(entries: dict[int, tuple[Any, ...]]) -> list[tuple[int, int]]:
    """(key, reference count of the object an entry holds first), for each entry."""
    return [(k, getrefcount(v[0])) for k, v in entries.items()]


# what ``_counts`` reads for an object that only its entry holds (measured, not assumed:
# how a call counts its argument differs between Python versions)
_ALONE = _counts({0: (object(),)})[0][1]


def _storage_bytes(t: torch.Tensor) -> int:
    """The bytes holding ``t`` keeps alive: its storage's (a view's base's too)."""
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # (no storage to read: a sparse tensor)
        return int(t.nbytes)
