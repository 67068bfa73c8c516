"""What a ``LightningGraph``'s evaluations add up to: the records of ``lg.history``.

Each validation (and test) sums, by name, its batches' values weighed by their
examples — the loss, the metric functions, and the metrics nodes return in
``Done(..., metrics=...)`` — on the device in float64 (no synchronisation per batch);
metric objects (``torchmetrics``) are updated per batch and computed over the whole
set. At its end the sums are reduced over ranks (the node metrics' names agreed on
first: a rank may have seen other ones) and averaged over examples into the record
``lg.history`` keeps, named as ``st.Trainer`` names its own: ``val_loss``,
``val_<metric>``, ``val_<node>/<name>``.

With several loaders (``trainer.fit(lg, train, [a, b])``) each set is its own: its own
sums and metric objects (copies of the ones given), its values named as Lightning logs
them, ``val_loss/dataloader_idx_0``, ``val_acc/dataloader_idx_1``... (``Evaluation``).

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .metrics import is_metric

__all__ = [
    "Evaluation",
    "Sums",
    "compute_objects",
    "log_objects",
    "metric_fix",
    "node_keys",
    "reset_objects",
    "scalar",
    "suffix",
]


def node_keys(reported: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The names ``<node>/<name>`` of the metrics nodes reported (``net.metrics``)."""
    return [f"{node}/{name}" for node, values in reported.items() for name in values]


NODE_FIX = "report a float or a one-element tensor in Done(..., metrics=...)"


def metric_fix(name: str) -> str:
    """The fix for a ``metrics=`` function that gave more than one number."""
    return (
        f"make metrics[{name!r}] return one number per batch (a mean over its examples), "
        "e.g. with .mean(), or pass a torchmetrics object for a metric over the whole set"
    )


def scalar(value: Any, where: str, fix: str = NODE_FIX) -> torch.Tensor | float:
    """A metric as ``self.log`` takes it: a detached one-element tensor or a float.

    Raises:
        TypeError: anything else, naming ``where`` it came from and ``fix``.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.detach().reshape(())
    if isinstance(value, (bool, int, float)):
        return float(value)
    shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
    raise TypeError(
        f"{where} is a {type(value).__name__}{shape}; Lightning logs scalars only — {fix}"
    )


def _dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


class Sums:
    """One evaluation's example-weighted sums: the loss and the metric functions (in the
    order given), and the node metrics (``<node>/<name>``, whichever nodes reported)."""

    def __init__(self) -> None:
        self.own: dict[str, Any] = {}
        self.nodes: dict[str, Any] = {}
        self.examples = 0
        self.total = 0  # the examples over every rank, once ``means`` has reduced them

    def add(self, name: str, value: torch.Tensor | float, n: int, *, node: bool = False) -> None:
        """Add a batch's ``value`` (a mean over its ``n`` examples), made float64 first: a
        bfloat16 mean times ``n`` would be rounded again."""
        if isinstance(value, torch.Tensor):
            weighted: Any = value.detach().to(_dtype(value.device)) * n
        else:
            weighted = float(value) * n
        into = self.nodes if node else self.own
        into[name] = into.get(name, 0.0) + weighted

    def means(self, device: torch.device, reduce: Any = None) -> dict[str, float]:
        """Each sum over the examples, over ranks when ``reduce`` (the strategy's
        ``reduce``; the ranks' node metric names are agreed on first) is given."""
        nodes = sorted(self.nodes)
        if reduce is not None:
            nodes = _agreed(nodes)
        names = [*self.own, *nodes]
        dtype = _dtype(device)
        parts = [
            torch.as_tensor(self.own.get(k, self.nodes.get(k, 0.0)), device=device).to(dtype)
            for k in names
        ]
        total = torch.stack([*parts, torch.tensor(float(self.examples), device=device).to(dtype)])
        if reduce is not None:
            total = reduce(total, reduce_op="sum")
        values = total.cpu().tolist()
        self.total = round(values[-1])
        if not self.total:  # (a set no rank saw a batch of)
            return {}
        return {k: values[j] / values[-1] for j, k in enumerate(names)}


def _agreed(names: list[str]) -> list[str]:
    """The node metric names any rank saw, sorted: one order for the all-reduce."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return names
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, names)
    return sorted({k for rank_names in gathered for k in rank_names})


def reset_objects(metrics: Mapping[str, Any], device: torch.device) -> None:
    """Reset each metric object (and move a ``torchmetrics`` one to ``device``)."""
    for m in metrics.values():
        if is_metric(m):
            m.reset()
            if isinstance(m, nn.Module):
                m.to(device)


def compute_objects(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Each metric object over the whole evaluation (``torchmetrics`` reduces over ranks
    itself), reset afterwards."""
    out = {}
    for name, m in metrics.items():
        if is_metric(m):
            out[name] = float(m.compute())
            m.reset()
    return out


def suffix(idx: int | None) -> str:
    """What Lightning appends to a name logged from loader ``idx`` of several
    (``/dataloader_idx_1``); nothing for a single loader (``idx`` None)."""
    return "" if idx is None else f"/dataloader_idx_{idx}"


class Evaluation:
    """One validation's (or test's) running state, per loader: each set's ``Sums`` and
    metric objects — the ones given for the first set, a fresh copy of each for every
    other — so that two sets never mix.

    Args:
        metrics: the module's metrics (functions and objects); objects are reset here.
        device: where the objects compute.
    """

    def __init__(self, metrics: Mapping[str, Any], device: torch.device) -> None:
        reset_objects(metrics, device)
        self._given = {name: m for name, m in metrics.items() if is_metric(m)}
        self.sums: dict[int | None, Sums] = {}
        self.objects: dict[int | None, dict[str, Any]] = {}
        self.terms: dict[int | None, list[str]] = {}  # a loader's first batch's loss terms

    def of(self, idx: int | None) -> tuple[Sums, dict[str, Any]]:
        """Loader ``idx``'s sums and metric objects (``idx`` None: the only loader)."""
        if idx not in self.sums:
            self.sums[idx] = Sums()
            self.objects[idx] = self._given if not idx else _copies(self._given, idx)
        return self.sums[idx], self.objects[idx]

    def record(
        self,
        prefix: str,
        sets: list[int | None],
        device: torch.device,
        reduce: Any,
        computed: Mapping[int | None, Mapping[str, float]],
    ) -> tuple[dict[str, float], dict[str, int]]:
        """What the evaluation adds up to, reduced over ranks by ``reduce`` (the same
        ``sets`` in the same order on every rank): each set's loss and metric functions,
        its objects' values (``computed[idx]``) and its node metrics, named
        ``<prefix><name><suffix>``; and the examples behind them (``val_examples``):
        ``{prefix: n}`` for one loader; for several, each name's set's count (a name
        differs from another set's only at its end, so it is its own prefix).
        A set without examples is left out."""
        values: dict[str, float] = {}
        examples: dict[str, int] = {}
        for idx in sets:
            sums, _ = self.of(idx)
            means = sums.means(device, reduce)
            if not sums.total:
                continue
            named = {
                **{k: v for k, v in means.items() if k in sums.own},
                **computed.get(idx, {}),
                **{k: v for k, v in means.items() if k not in sums.own},
            }
            end = suffix(idx)
            values.update({f"{prefix}{k}{end}": v for k, v in named.items()})
            if idx is None:
                examples[prefix] = sums.total
            else:
                examples.update({f"{prefix}{k}{end}": sums.total for k in named})
        return values, examples


def _copies(metrics: Mapping[str, Any], idx: int) -> dict[str, Any]:
    """Fresh copies of the metric objects, for loader ``idx``."""
    out = {}
    for name, m in metrics.items():
        try:
            out[name] = copy.deepcopy(m)
        except Exception as e:
            raise TypeError(
                f"metric {name!r} ({type(m).__qualname__}) cannot be copied for validation "
                f"loader {idx}: with several loaders each needs its own, and copy.deepcopy "
                f"failed ({e}); make it copyable, or validate one loader per fit"
            ) from e
        out[name].reset()
    return out


def log_objects(
    lg: Any, prefix: str, evaluation: Evaluation, sets: list[int | None]
) -> dict[int | None, dict[str, float]]:
    """Each set's metric objects over the whole set, logged by ``lg`` (a ``LightningGraph``)
    as ``<prefix><name>`` (``.../dataloader_idx_<i>`` with several loaders, as Lightning
    names the rest)."""
    out = {}
    for idx in sets:  # (every rank the same sets, in order: torchmetrics syncs in compute)
        out[idx] = compute_objects(evaluation.of(idx)[1])
        for name, value in out[idx].items():
            lg.log(f"{prefix}{name}{suffix(idx)}", value, prog_bar=False, add_dataloader_idx=False)
    return out
