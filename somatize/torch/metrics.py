"""Metrics: what ``Trainer(metrics={...})`` takes, and the evaluation that computes them.

A metric is either

* a function ``fn(output, target) -> scalar``, a mean over the batch: evaluation
  weighs each batch by its number of examples, so a smaller last batch weighs less
  (right for accuracy or a mean loss, wrong for F1 or AUROC); or
* an object with ``reset()``, ``update(output, target)`` and ``compute()`` — a
  ``torchmetrics.Metric`` as it is — computed over the whole set: reset when an
  evaluation starts, updated per batch, computed at its end.

Metrics nodes return in ``Done(..., metrics=...)`` during evaluation are averaged
over examples too, as ``<node>/<name>``.

A torchmetrics ``MetricCollection`` is taken apart into its members when the Trainer (or
``LightningGraph``) is made (``members``): given as ``metrics=`` whole, each member is
evaluated under its own name, as Lightning's ``self.log_dict(collection)`` logs it; given
under a name, ``metrics={"cls": collection}``, as ``cls_<member>``.

Under DDP every value is over all ranks' batches, the same on every rank: sums are
all-reduced (the node metrics' names agreed on first, so a rank that saw none adds
zeros); a torchmetrics metric reduces itself in ``compute``; any other metric object
needs ``merge(other)``, which folds another rank's object into it: every rank gathers
all ranks' objects, merges them into rank 0's in rank order, and computes that.
A torchmetrics metric holding lists of tensors (AUROC's) is refused when a rank
evaluated no batch of the set: torchmetrics cannot gather that rank's empty state.
"""

from __future__ import annotations

import contextlib
import numbers
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ..errors import SettingError, add_note
from . import ddp
from .accuracy import accuracy
from .batches import epoch_batches, num_examples, to_device
from .limits import limited
from .loss_terms import refused_return
from .metric_notes import call_note
from .module_reads import node_metrics

__all__ = ["Metric", "accuracy", "check_ranks", "evaluate", "is_metric", "members"]


@runtime_checkable
class Metric(Protocol):
    """A metric over a whole set: ``reset``, ``update`` per batch, ``compute`` at the end.

    ``torchmetrics.Metric`` fits as it is. Under DDP an object of your own also needs
    ``merge(other)``: fold ``other`` (the same kind of object, updated on another rank's
    batches, a copy unpickled here) into this one, so that ``compute`` then gives the
    value over both (see ``check_ranks``).
    """

    def reset(self) -> None: ...

    def update(self, output: Any, target: Any) -> None: ...

    def compute(self) -> Any: ...


def is_metric(value: Any) -> bool:
    """Whether ``value`` is a metric object (not a plain function)."""
    return all(callable(getattr(value, m, None)) for m in ("reset", "update", "compute"))


def members(metrics: Any) -> Any:
    """``metrics`` with each torchmetrics ``MetricCollection`` replaced by its members (see
    the module's docstring); anything else as it is, to be checked as it is.

    Example:
        >>> from torchmetrics import MetricCollection
        >>> from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
        >>> both = MetricCollection({"acc": MulticlassAccuracy(3), "f1": MulticlassF1Score(3)})
        >>> sorted(members(both)), sorted(members({"cls": both}))
        (['acc', 'f1'], ['cls_acc', 'cls_f1'])
    """
    if _collection(metrics):
        return dict(metrics.items(keep_base=False, copy_state=False))
    if not isinstance(metrics, Mapping) or not any(map(_collection, metrics.values())):
        return metrics
    out: dict[Any, Any] = {}
    for name, m in metrics.items():
        inner = m.items(keep_base=False, copy_state=False) if _collection(m) else [("", m)]
        for member, metric in inner:
            out[f"{name}_{member}" if member else name] = metric
    return out


def _collection(m: Any) -> bool:
    tm = sys.modules.get("torchmetrics")  # imported already if ``m`` is one
    return tm is not None and isinstance(m, tm.MetricCollection)


def check_ranks(fns: Mapping[str, Any], world: int) -> None:
    """Refuse, under DDP (``world`` > 1), a metric object that cannot combine over ranks.

    A ``torchmetrics.Metric`` reduces its states over ranks in ``compute``; any other
    object needs ``merge(other)``. Without either each rank would compute over its own
    share of the evaluation data, and the ranks would rank checkpoints and prune on
    different values.

    Raises:
        SettingError: naming each such metric and the fix.

    Example:
        >>> class Hits:
        ...     def reset(self): self.hits = 0
        ...     def update(self, output, target): self.hits += int((output.argmax(-1) == target).sum())
        ...     def compute(self): return self.hits
        ...     def merge(self, other): self.hits += other.hits
        >>> check_ranks({"hits": Hits()}, world=2)  # no error: Hits can merge
    """
    if world <= 1:
        return
    for name, m in fns.items():
        if not is_metric(m):
            continue
        kind = type(m).__qualname__
        if _torchmetrics(m):
            if getattr(m, "sync_on_compute", True) is False:
                raise SettingError(
                    f"metric {name!r} ({kind}) was made with sync_on_compute=False, so under "
                    f"DDP each of the {world} ranks would compute it over its own share of "
                    "the evaluation data; leave sync_on_compute=True (the default)"
                )
        elif not callable(getattr(m, "merge", None)):
            raise SettingError(
                f"metric {name!r} ({kind}) has no merge(other), so under DDP each of the "
                f"{world} ranks would compute it over its own share of the evaluation data; "
                f"give {kind} a method merge(self, other) that adds another rank's state "
                "into its own (e.g. self.hits += other.hits; self.total += other.total), or "
                "make it a torchmetrics.Metric (add_state(..., dist_reduce_fx='sum'))"
            )


def _torchmetrics(m: Any) -> bool:
    """Whether ``m`` is a torchmetrics metric (which reduces over ranks itself)."""
    tm = sys.modules.get("torchmetrics")  # imported already if ``m`` is one
    return tm is not None and isinstance(m, tm.Metric)


def evaluate(
    net: nn.Module,
    data: Iterable[Any],
    fns: Mapping[str, Callable[[Any, Any], Any] | Metric],
    *,
    split: Callable[[Any], tuple[Any, Any]],
    device: torch.device,
    autocast: Callable[[], Any],
    rank: int = 0,
    world: int = 1,
    limit: int | None = None,
    aside: Callable[[], Mapping[str, Any]] | None = None,
) -> dict[str, float]:
    """Each of ``fns`` on ``net``'s outputs over ``data`` (and ranks): functions averaged
    over examples, metric objects computed over the whole set; then node metrics.
    ``limit``: only the first batches of this rank's share (``Options(limit_val_batches=)``).
    ``aside``: more values of each batch (the loss's terms), averaged as node metrics are.

    Runs in eval mode under ``torch.no_grad()`` and restores the module's mode; the
    forward *and* the functions run under ``autocast`` (Lightning's ``validation_step``
    does the same), and each batch's value is made float64 (float32 on MPS) before it
    is weighed by the batch's size. Under DDP each rank takes every ``world``-th batch,
    none dropped, and the sums are reduced (metric objects merged: see the module's
    docstring). Values are summed as Python floats on the CPU (float64 arithmetic, as a
    float64 tensor's) and on the device elsewhere: no synchronisation per batch.

    Raises:
        SettingError: under DDP, a metric object that cannot combine over ranks.
    """
    check_ranks(fns, world)
    was_training = net.training
    net.eval()
    names = [k for k, f in fns.items() if not is_metric(f)]
    objects: dict[str, Metric] = {k: f for k, f in fns.items() if is_metric(f)}  # type: ignore[misc]
    for m in objects.values():
        m.reset()
        if isinstance(m, nn.Module):
            m.to(device)
    dtype = torch.float32 if device.type == "mps" else torch.float64
    # On the CPU the sums are Python floats: the float64 products and additions a float64
    # tensor makes, in the same order, without three tensor ops a batch and metric (7% of
    # evaluating a small MLP); elsewhere they stay on the device, with no sync per batch
    host = device.type == "cpu"
    sums: Any = (  # the last counts examples
        [0.0] * (len(names) + 1)
        if host
        else torch.zeros(len(names) + 1, dtype=dtype, device=device)
    )
    node_sums: dict[str, Any] = {}  # "<node>/<name>" -> example-weighted sum
    # Under DDP every rank reads the loader and takes its share of the batches: a sampler
    # drawing from the global RNG (a SubsetRandomSampler) must draw the same on every
    # rank, or rows are read twice and others never. The ranks read it from one seeded
    # state, on a fork of the RNG (training's own draws are not moved).
    agreed = torch.random.fork_rng(devices=[]) if world > 1 else contextlib.nullcontext()
    try:
        with torch.no_grad(), agreed:
            if world > 1:
                torch.manual_seed(0)
            for batch in limited(epoch_batches(data, 0, 0, False, rank, world, even=False), limit):
                x, y = split(batch)
                x, y = to_device(x, device), to_device(y, device)
                n = num_examples(x)
                # the loss and metrics too, as Lightning's validation_step and the training
                # step compute them: cross_entropy runs in float32 under autocast
                with autocast():
                    out = net(x)
                    for j, name in enumerate(names):
                        try:
                            got = fns[name](out, y)  # type: ignore[operator]
                        except Exception as e:
                            if not refused_return(e):  # (its message says what to return)
                                add_note(e, call_note(name, out, y))
                            raise
                        value = _scalar(got, name)
                        sums[j] += (float(value) if host else _exact(value, dtype)) * n
                    for name, m in objects.items():
                        try:
                            m.update(out, y)
                        except Exception as e:
                            add_note(e, call_note(name, out, y, update=True))
                            raise
                sums[-1] += n
                for node, values in (node_metrics(net) or {}).items():
                    for k, v in node_scalars(node, values).items():
                        key = f"{node}/{k}"
                        v = float(v) if host else _exact(v, dtype)
                        node_sums[key] = node_sums.get(key, 0.0) + v * n
                for key, v in (aside() if aside is not None else {}).items():
                    v = float(v) if host else _exact(v, dtype)
                    node_sums[key] = node_sums.get(key, 0.0) + v * n
    finally:
        net.train(was_training)
    if host:
        sums = torch.tensor(sums, dtype=dtype)
    node_names = sorted(node_sums)
    merging = {k: m for k, m in objects.items() if not _torchmetrics(m)}
    if world > 1 and (merging or aside is not None or isinstance(node_metrics(net), Mapping)):
        node_names, objects = _combined(node_names, objects, merging)
    _check_clash(fns, node_names)  # (under DDP, the names every rank agreed on)
    if node_names:  # one reduction and one read-back for all of them
        node_t = torch.stack(
            [torch.as_tensor(node_sums.get(k, 0.0), dtype=dtype, device=device) for k in node_names]
        )
        sums = torch.cat([sums[:-1], node_t, sums[-1:]])
    if world > 1:  # with, last, the number of ranks that evaluated no batch
        sums = ddp.total(torch.cat([sums, (sums[-1:] == 0).to(dtype)]))
    values = sums.tolist()
    empty = int(values.pop()) if world > 1 else 0
    if values[-1] == 0:
        raise ValueError(
            "the evaluation data yielded no batches (an empty list, a DataLoader over no "
            "examples, or an iterator used up already): pass at least one batch"
        )
    if empty:
        _check_gatherable(objects, empty, world)
    out_values = {name: values[j] / values[-1] for j, name in enumerate(names)}
    for name, m in objects.items():
        out_values[name] = _computed(m.compute(), name)
    for j, key in enumerate(node_names):
        out_values[key] = values[len(names) + j] / values[-1]
    return {k: out_values[k] for k in [*fns, *node_names]}


def _check_gatherable(objects: Mapping[str, Metric], empty: int, world: int) -> None:
    """Refuse, on every rank alike, a torchmetrics metric holding lists of tensors (AUROC's
    outputs, concatenated) when ``empty`` ranks evaluated no batch: torchmetrics would gather
    an empty rank's state with another shape and dtype, and the process group would abort."""
    for name, m in objects.items():
        states = getattr(m, "metric_state", {}) if _torchmetrics(m) else {}
        if any(isinstance(v, list) for v in states.values()):
            raise SettingError(
                f"metric {name!r} ({type(m).__qualname__}) concatenates its batches' values, "
                f"and rank {world - empty} of {world} evaluated no batch of this set (it has "
                f"fewer batches than ranks): torchmetrics cannot gather an empty rank's "
                "state. Give every rank a batch — a smaller batch_size, or "
                f"Options(limit_val_batches=) of at least {world} — or evaluate this set in "
                "one process"
            )


def _check_clash(fns: Mapping[str, Any], node_names: Any, who: str = "Trainer") -> None:
    """Refuse a metric named as a node's metric ``<node>/<name>``: one value would be lost."""
    for key in node_names:
        if key in fns:
            node, _, name = key.partition("/")
            raise SettingError(
                f"metric {key!r} of {who}(metrics=...) has the name of the metric {name!r} "
                f"that node {node!r} returns in Done(..., metrics=...): one would overwrite "
                f"the other; rename the metric (e.g. {key.replace('/', '_')!r})"
            )


def _combined(
    node_names: list[str], objects: dict[str, Metric], merging: dict[str, Metric]
) -> tuple[list[str], dict[str, Metric]]:
    """Under DDP, in one gather: the node metrics' names any rank saw (a rank may have seen
    none: it had no batch, or a node reported only on some), sorted so every rank reduces
    them in one order; and each object of ``merging`` as every rank's merged into rank 0's
    copy in rank order, the same on every rank (torchmetrics ones stay: they reduce
    themselves)."""
    gathered = ddp.gather((node_names, merging))
    names = sorted({k for rank_names, _ in gathered for k in rank_names})
    merged = dict(objects)
    for name in merging:
        into = gathered[0][1][name]
        for _, theirs in gathered[1:]:
            into.merge(theirs[name])  # type: ignore[attr-defined]
        merged[name] = into
    return names, merged


def _computed(value: Any, name: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"metric {name!r} computed a tensor of shape {tuple(value.shape)}; a metric "
                "gives one number (for torchmetrics, pass average='macro' or similar). For "
                "a confusion matrix or per-class values, compute it on predict's outputs: "
                "metric(torch.cat(trainer.predict(model, data)), torch.cat([y for _, y in "
                "data]))"
            )
        return float(value)
    return _number(value, f"metric {name!r} computed")


def node_scalars(node: str, values: Any) -> dict[str, Any]:
    """What node ``node`` returned as ``Done(metrics=...)``: name -> a 0-d tensor or a
    float; anything else a TypeError naming the node, the metric and the fix."""
    if not isinstance(values, Mapping):
        raise TypeError(
            f"node {node!r} returned Done(..., metrics={values!r}); metrics "
            "is a dict name → number, e.g. Done(out, metrics={'mean': out.mean()})"
        )
    return {k: _scalar(v, k, f"node {node!r}: ") for k, v in values.items()}


def _scalar(value: Any, name: str, whose: str = "") -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"{whose}{name!r} must give one number per batch (a mean), got a tensor of "
                f"shape {tuple(value.shape)}; reduce it, e.g. with .mean()"
            )
        return value.detach().reshape(())
    return _number(value, f"{whose}metric {name!r} gave")


def _exact(value: Any, dtype: torch.dtype) -> Any:
    """A batch's scalar in the sums' dtype *before* it is weighed by the batch size: a
    bfloat16 or float16 mean times ``n`` would be rounded again (on the device: no sync)."""
    return value.to(dtype) if isinstance(value, torch.Tensor) else value


def _number(value: Any, what: str) -> float:
    """``value`` as a float; anything but a real number is a TypeError naming ``what``."""
    if not isinstance(value, numbers.Real):
        several = (
            "; for several numbers give each its own entry, metrics={"
            + ", ".join(f"{k!r}: ..." for k in list(value)[:3])
            + "}, or a torchmetrics MetricCollection (each member is evaluated as one)"
            if isinstance(value, Mapping)
            else ""
        )
        raise TypeError(
            f"{what} {value!r} ({type(value).__qualname__}), not a number; a metric gives one "
            f"number per batch — a float, an int or a one-element tensor (e.g. x.mean()){several}"
        )
    return float(value)
