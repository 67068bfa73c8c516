"""Tensor rows for per-example memory: the ``rows`` of ``TensorCodec`` (see ``somatize/rows.py``).

A row is ``t[i]`` along dim 0. Hashing a batch is one keyed blake3 call per row over a
zero-copy view of the batch's bytes (no per-row tensor is made); stored rows are rebuilt
with one ``torch.frombuffer`` over their joined bytes, then moved to the target device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from blake3 import blake3

from .tensor_keys import _PLAIN, subclass_error
from .tensor_keys import tensor_bytes as _tensor_bytes

__all__ = ["TensorRows", "empty"]


def empty(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """The tensor of ``shape`` that a payload without bytes stands for: one with no
    elements. A shape with elements and no bytes (a damaged or crafted entry) is a
    ``ValueError``: ``torch.empty`` would hand back that much uninitialised memory
    (gigabytes, from a few bytes of header) as if it were the value stored."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else None
    if dims is None or not all(type(d) is int and d >= 0 for d in dims) or 0 not in dims:
        raise ValueError(f"a tensor payload of shape {shape!r} holds no bytes")
    return torch.empty(dims, dtype=dtype)


class TensorRows:
    """Rows along dim 0 of tensors: keys, bytes, selection and assembly."""

    def count(self, t: torch.Tensor) -> int:
        if t.dim() == 0:
            raise ValueError("a 0-d tensor has no rows")
        return int(t.shape[0])

    def layout(self, t: torch.Tensor) -> Any:
        return (str(t.dtype).removeprefix("torch."), tuple(t.shape[1:]))

    def rows(self, t: torch.Tensor) -> tuple[memoryview, int]:
        if type(t) not in _PLAIN:  # (its type would enter no row's key)
            raise subclass_error(t)
        n = int(t.shape[0])
        view = _tensor_bytes(t)
        return view, (len(view) // n if n else 0)

    def keys(self, t: torch.Tensor, salt: bytes) -> list[str]:
        view, nb = self.rows(t)
        if not nb:
            return [blake3(b"", key=salt).hexdigest()] * int(t.shape[0])
        # One keyed hasher, reset after each row: a reset costs less than a copy of a
        # keyed hasher per row (a third of a row's key), and either less than a keyed
        # constructor. One hex conversion for the whole batch costs less than a
        # hexdigest() per row.
        h, out = blake3(key=salt), list[bytes]()
        update, digest, reset, put = h.update, h.digest, h.reset, out.append
        for i in range(0, len(view), nb):
            update(view[i : i + nb])
            put(digest())
            reset()  # (back to the keyed initial state: the key is kept)
        text = b"".join(out).hex()
        return [text[i : i + 64] for i in range(0, len(text), 64)]

    def digests(self, t: torch.Tensor) -> list[bytes]:
        view, nb = self.rows(t)
        if not nb:
            return [blake3(b"").digest()] * int(t.shape[0])
        h, out = blake3(), list[bytes]()
        update, digest, reset, put = h.update, h.digest, h.reset, out.append
        for i in range(0, len(view), nb):  # (one hasher, reset: as in keys)
            update(view[i : i + nb])
            put(digest())
            reset()
        return out

    def take(self, t: torch.Tensor, index: Sequence[int]) -> torch.Tensor:
        return t.index_select(0, torch.as_tensor(index, dtype=torch.long, device=t.device))

    def build(self, layout: Any, raw: bytearray, n: int, device: str | None) -> torch.Tensor:
        name, shape = layout
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a row layout names {name!r}, which is not a torch dtype")
        if raw:
            out = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(n, *shape)
        else:
            out = empty((n, *shape), dtype)
        return self.move(out, device) if device is not None else out

    def scatter(self, parts: Sequence[tuple[Sequence[int], torch.Tensor]], n: int) -> torch.Tensor:
        first = parts[0][1]
        out = torch.empty((n, *first.shape[1:]), dtype=first.dtype, device=first.device)
        for index, rows in parts:
            at = torch.as_tensor(index, dtype=torch.long, device=out.device)
            out.index_copy_(0, at, rows.to(device=out.device, dtype=out.dtype))
        return out

    def version(self, t: torch.Tensor) -> int | None:
        try:
            return int(t._version)
        except RuntimeError:  # an inference tensor keeps no version counter
            return None

    def device(self, t: torch.Tensor) -> str:
        return str(t.device)

    def move(self, t: torch.Tensor, device: str) -> torch.Tensor:
        return t if str(t.device) == device else t.to(device)
