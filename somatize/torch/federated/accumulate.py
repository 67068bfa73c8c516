"""The float64 weighted sum every mean-based aggregator computes, at memory speed on the CPU:
cache-sized slices for large tensors, stacked groups of clients for small ones."""

from __future__ import annotations

import math

import torch

__all__: list[str] = []


# float64 elements per slice (two 2 MiB buffers): the fastest of 2**15..2**19 measured
_CHUNK = 1 << 18


class _Scratch:
    """Buffers reused across keys: for large tensors, two float64 slices (the running sum and
    one client's converted slice); for small ones, a block of stacked clients per dtype.
    Fresh buffers of this size come from fresh pages: on the CPU, writing one costs its
    page faults, more than the arithmetic done in it."""

    def __init__(self) -> None:
        self.acc: torch.Tensor | None = None
        self.tmp: torch.Tensor | None = None
        self.blocks: dict[torch.dtype, torch.Tensor] = {}

    def block(self, rows: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        """A (rows, n) block of ``dtype`` (CPU), reused while it is large enough."""
        flat = self.blocks.get(dtype)
        if flat is None or flat.numel() < rows * n:
            flat = self.blocks[dtype] = torch.empty(rows * n, dtype=dtype)
        return flat[: rows * n].view(rows, n)

    def get(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if (
            self.acc is None
            or self.tmp is None
            or self.acc.numel() < n
            or self.acc.device != device
        ):
            self.acc = torch.empty(n, dtype=torch.float64, device=device)
            self.tmp = torch.empty(n, dtype=torch.float64, device=device)
        return self.acc[:n], self.tmp[:n]


def _weighted_mean(
    tensors: list[torch.Tensor], weights: list[float], dtype: torch.dtype, scratch: _Scratch
) -> torch.Tensor | None:
    """sum(w * t) accumulated in float64 and written in ``dtype`` (flat), or None if not finite.

    On the CPU a slice at a time: each client's slice is converted into one reused
    float64 buffer and added to a float64 running sum of the same slice, and the
    finished slice is checked and cast straight into the result. No float64 copy of a
    whole tensor is made, the two buffers stay in cache, and every client tensor is
    read once. (A mixed-dtype ``add_`` would convert into a fresh full-size temporary
    first: TensorIterator promotes CPU inputs by copying them.) Small tensors (many
    clients of a small model) are stacked instead, a cache-sized group of clients at a
    time, and summed by one float64 matrix-vector product per group: a few calls per
    key rather than two per client. Elsewhere (CUDA), the mixed-dtype ``add_`` converts
    inside the kernel, so whole tensors are added.
    """
    n, device = tensors[0].numel(), tensors[0].device
    if device.type != "cpu":
        acc = torch.zeros(n, dtype=torch.float64, device=device)
        for w, t in zip(weights, tensors):
            acc.add_(t.reshape(-1), alpha=w)
        return acc.to(dtype) if _finite_sum(acc) else None
    if n <= _SMALL:
        return _stacked_mean(tensors, weights, dtype, scratch)
    out = torch.empty(n, dtype=dtype, device=device)
    flat = [t.reshape(-1) for t in tensors]
    acc_all, tmp_all = scratch.get(min(n, _CHUNK), device)
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        acc, tmp = acc_all[: stop - start], tmp_all[: stop - start]
        for i, (w, t) in enumerate(zip(weights, flat)):
            piece = t[start:stop]
            if i == 0:
                acc.copy_(piece).mul_(w)
            elif piece.dtype == torch.float64:
                acc.add_(piece, alpha=w)
            else:
                acc.add_(tmp.copy_(piece), alpha=w)
        if not _finite_sum(acc):
            return None
        out[start:stop].copy_(acc)
    return out


_SMALL = 1 << 14  # elements: tensors up to this size are stacked, a group of clients at a time


def _stacked_mean(
    tensors: list[torch.Tensor], weights: list[float], dtype: torch.dtype, scratch: _Scratch
) -> torch.Tensor | None:
    """A cache-sized group of clients at a time: stacked into a reused block, converted into
    a reused float64 block, and added to the sum by one matrix-vector product."""
    n = tensors[0].numel()
    if not n:
        return torch.empty(0, dtype=dtype)
    group = min(len(tensors), max(1, _CHUNK // n))
    w64 = torch.tensor(weights, dtype=torch.float64)
    acc = torch.zeros(n, dtype=torch.float64)
    shape = tensors[0].shape
    for g in range(0, len(tensors), group):
        part = tensors[g : g + group]
        rows = len(part)
        block = scratch.block(group, n, torch.float64)[:rows]
        if dtype == torch.float64:
            torch.stack(part, out=block.view(rows, *shape))
        else:  # (stacking into a block of their own dtype, then converting, costs least)
            own = scratch.block(group, n, dtype)[:rows]
            torch.stack(part, out=own.view(rows, *shape))
            block.copy_(own)
        acc.addmv_(block.t(), w64[g : g + rows])
    return acc.to(dtype) if _finite_sum(acc) else None


def _finite_sum(acc: torch.Tensor) -> bool:
    """Whether every element is finite: one sum (finite unless an element is not, or the sum
    overflows), and the element-wise check only when it is not."""
    return math.isfinite(float(acc.sum())) or bool(torch.isfinite(acc).all())
