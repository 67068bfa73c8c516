"""The epoch's mean of each node metric, Lightning's ``self.log(..., on_epoch=True)``:
``EpochEnd.node_metrics``, ``TrainResult.epoch_metrics``.

A node reports a metric of the batch it computed, ``Done(value, metrics={"acc": ...})``;
the epoch's is ``sum(value * examples) / sum(examples)`` over the batches that reported it
(each micro-batch and accumulated batch its own, of this rank's examples; under DDP, the
sums of every rank at the epoch's end), a skipped step (``nonfinite="skip"``) left out —
the mean Lightning logs as ``<name>_epoch`` for values logged with their ``batch_size``.

A step's values stay on the device, pending, and are read back together (one transfer)
at the epoch's end, at a checkpoint, or every ``_HELD`` values: a step pays for no read.
The sums are plain floats and ints, one set per rank in every checkpoint, so a run
resumed in mid-epoch adds the same numbers in the same order as the uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from . import ddp
from .metrics import _scalar, node_scalars

__all__ = ["EpochMetrics", "flat"]

_HELD = 4096  # the pending values read back at once, at most (one 0-d tensor each)

Key = tuple[str, str]  # (node, metric)
_Tensor = torch.Tensor


class EpochMetrics:
    """The running sums of the epoch in progress: (node, metric) -> [total, examples]."""

    __slots__ = ("pending", "sums")

    def __init__(self) -> None:
        self.sums: dict[Key, list[Any]] = {}
        self.pending: list[tuple[Key, Any, int]] = []

    def add(self, reported: Mapping[str, Any], examples: int) -> None:
        """What the nodes reported of one batch of ``examples`` (``GraphModule.metrics``),
        each checked as ``Metrics`` are (a TypeError naming the node and metric)."""
        pending = self.pending
        for node, values in reported.items():
            items = values.items() if type(values) is dict else node_scalars(node, values).items()
            for name, value in items:
                # a 0-d tensor cut from autograd is kept as it is (a µs a step); anything
                # else checked (a TypeError naming node and metric), detached, reshaped
                if type(value) is not _Tensor or value.requires_grad or value.dim():
                    value = _scalar(value, name, f"node {node!r}: ")
                pending.append(((node, name), value, examples))
        if len(pending) >= _HELD:
            self.flush()

    def flush(self) -> None:
        """Read the pending values back (one transfer per device and dtype), into the sums
        in the order the batches gave them."""
        if not self.pending:
            return
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        values: list[Any] = [v for _, v, _ in self.pending]
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                groups.setdefault((v.device, v.dtype), []).append(i)
        for at in groups.values():
            for i, got in zip(at, torch.stack([values[i] for i in at]).tolist(), strict=True):
                values[i] = got
        sums = self.sums
        for (key, _, n), v in zip(self.pending, values, strict=True):
            kept = sums.get(key)
            if kept is None:
                kept = sums[key] = [0.0, 0]
            kept[0] += float(v) * n
            kept[1] += n
        self.pending.clear()

    def take(self, world: int) -> dict[str, dict[str, float]]:
        """The epoch's means, node -> metric -> mean (under DDP every rank's sums, added in
        rank order: collective, on every rank); the sums start afresh."""
        self.flush()
        sums = self.sums
        if world > 1:
            sums = _merged(ddp.gather(self.state()))
        self.sums = {}
        out: dict[str, dict[str, float]] = {}
        for (node, name), (total, n) in sums.items():
            if n:
                out.setdefault(node, {})[name] = total / n
        return out

    def state(self) -> list[list[Any]]:
        """The sums as a checkpoint holds them, ``[node, metric, total, examples]`` each
        (strings, floats, ints: weights_only); the pending values read back first."""
        self.flush()
        return [[node, name, float(t), int(n)] for (node, name), (t, n) in self.sums.items()]

    @classmethod
    def restored(cls, saved: Any, rank: int = 0, world: int = 1) -> EpochMetrics:
        """This rank's sums from a checkpoint's (one ``state()`` per rank that wrote it);
        written by another number of ranks, rank 0 takes them all (the means alike) and the
        others none; fresh ones from a checkpoint from before they were kept."""
        out = cls()
        if not isinstance(saved, list) or not saved:
            return out
        if len(saved) == world:
            out.sums = _merged([saved[rank]])
        elif rank == 0:
            out.sums = _merged(saved)
        return out


def _merged(states: list[Any]) -> dict[Key, list[Any]]:
    """The sums of several ``state()``s, added in order; malformed entries left out."""
    out: dict[Key, list[Any]] = {}
    for state in states:
        for entry in state if isinstance(state, list) else ():
            if not (isinstance(entry, (list, tuple)) and len(entry) == 4):
                continue
            node, name, total, n = entry
            if isinstance(total, (int, float)) and isinstance(n, int) and n >= 0:
                kept = out.setdefault((str(node), str(name)), [0.0, 0])
                kept[0] += float(total)
                kept[1] += n
    return out


def flat(means: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """``take()``'s means as ``TrainResult.epoch_metrics`` names them: ``<node>/<metric>``."""
    return {f"{node}/{name}": v for node, values in means.items() for name, v in values.items()}
