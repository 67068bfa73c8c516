"""Validation sets: ``fit(val=loader)``, or ``fit(val={"clean": a, "noisy": b})``.

One loader's metrics are named as they always were: ``val_loss``, ``val_<metric>``,
``val_<node>/<name>``. A dict of name → loader evaluates each set at every evaluation, in
the dict's order, and prefixes its metrics with its name: ``val_clean_loss``,
``val_clean_<metric>``, ``val_clean_<node>/<name>``; ``Options(monitor=...)`` (and a
pruner's metric) names one of them, and its default, ``"val_loss"``, is the first set's
(``val_clean_loss``). All sets' values go into one record per evaluation.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SettingError
from ..stack import outside
from .limits import batches_per_epoch

__all__ = [
    "ValSet",
    "check_reusable",
    "check_val",
    "evaluated_names",
    "monitored",
    "refuse_sets",
    "val_sets",
    "warn_dropped",
]


@dataclass(frozen=True)
class ValSet:
    """One validation set of a run: its name ("" for a single ``val``), its batches, and
    how many of them an evaluation takes (``Options(limit_val_batches=)``; None: all)."""

    name: str
    data: Iterable[Any]
    limit: int | None = None

    @property
    def prefix(self) -> str:
        """What its metrics' names start with: ``val_``, or ``val_<name>_``."""
        return f"val_{self.name}_" if self.name else "val_"


def check_val(val: Any, metrics: Mapping[str, Any]) -> None:
    """A dict ``val=``: named sets (non-empty strings, no ``/``), whose metric names —
    ``val_<set>_<metric>`` — do not collide (``a`` + ``b_loss`` vs ``a_b`` + ``loss``)."""
    if not isinstance(val, Mapping):
        return
    if not val:
        raise SettingError(
            "val= is an empty dict; pass {name: batches} with at least one set, one loader "
            "(val=batches), or None to train without evaluating"
        )
    for name, data in val.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise SettingError(
                f"val= names its sets by non-empty strings without '/', not {name!r}; e.g. "
                "val={'clean': clean_batches, 'noisy': noisy_batches}"
            )
        readable = isinstance(data, Iterable) or hasattr(type(data), "__getitem__")
        # (a map-style dataset of batches is read by index, as for val=dataset)
        if data is None or isinstance(data, (str, bytes)) or not readable:
            raise SettingError(
                f"val set {name!r} is {type(data).__qualname__}, not batches; each value of "
                "val= is a sequence of batches or a DataLoader"
            )
    seen: dict[str, str] = {}
    for name in val:
        for metric in ("loss", *metrics):
            key = f"val_{name}_{metric}"
            if key in seen:
                raise SettingError(
                    f"val sets {seen[key]!r} and {name!r} would both log {key!r}; rename a "
                    "set (or a metric) so every evaluated name is its own"
                )
            seen[key] = name


def check_reusable(val: Any, epochs: int | None, options: Any) -> None:
    """A one-shot iterator (a generator) as ``val`` is used up by its first evaluation:
    refused when the run evaluates more than once (more than one epoch end on the
    schedule, or every N steps), before any step rather than after the first evaluation."""
    every_epochs = options.eval_every_epochs or 1
    once = options.eval_every_steps is None and epochs is not None and epochs // every_epochs <= 1
    named = val.items() if isinstance(val, Mapping) else [("", val)]
    for name, data in named:
        if isinstance(data, Iterator) and not once:
            which = f"val set {name!r}" if name else "val="
            raise SettingError(
                f"{which} is a {type(data).__qualname__}, an iterator the first evaluation "
                "uses up, and this run evaluates more than once; pass a list of batches "
                "(list(...) of it) or a DataLoader, which can be read again"
            )


def monitored(monitor: str, val: Any) -> str:
    """What ``Options(monitor=...)`` watches in a fit given ``val``: the default
    ``"val_loss"``, with several validation sets, is the first set's loss
    (``val_<first>_loss``) for ``TrainResult.best``; any other name is as given. What
    acts on the monitor — best checkpoints, an Optuna trial, ``ReduceLROnPlateau`` —
    needs the set named (``settings.check_fit``, ``begin``)."""
    if monitor == "val_loss" and isinstance(val, Mapping) and val:
        return f"val_{next(iter(val))}_loss"
    return monitor


def evaluated_names(val: Any, metrics: Mapping[str, Any]) -> list[str]:
    """The names an evaluation of ``val`` produces (node metrics aside)."""
    prefixes = [f"val_{name}_" for name in val] if isinstance(val, Mapping) else ["val_"]
    return [f"{p}{m}" for p in prefixes for m in ("loss", *metrics)]


def val_sets(
    val: Iterable[Any] | Mapping[str, Iterable[Any]] | None,
    limit: int | float | None,
    rank: int,
    world: int,
) -> list[ValSet] | None:
    """``val=`` as a run's sets, each with its batch limit resolved against its data."""
    if val is None:
        return None
    named = val.items() if isinstance(val, Mapping) else [("", val)]
    return [
        ValSet(
            name, data, batches_per_epoch("limit_val_batches", limit, data, rank, world, even=False)
        )
        for name, data in named
    ]


def refuse_sets(data: Any, method: str) -> None:
    """``evaluate``/``predict`` take one data set, not a dict of them."""
    if isinstance(data, Mapping):
        raise SettingError(
            f"{method}() takes one data set (batches or a DataLoader), not a dict of them; "
            f"for several, call it on each: {{name: trainer.{method}(model, data) for name, "
            "data in sets.items()}"
        )


def warn_dropped(data: Any, where: str, limit: int | None = None) -> None:
    """Warn when ``data`` is a DataLoader with ``drop_last=True`` whose examples are not a
    whole number of batches: an evaluation never reads the remainder, so every metric would
    be over fewer examples than the set holds, without a word. ``limit``: the batches an
    evaluation reads (``Options(limit_val_batches=)``), which may stop before the short one.
    """
    sampler = getattr(data, "batch_sampler", None)
    size = getattr(sampler, "batch_size", None)
    if not getattr(sampler, "drop_last", False) or not isinstance(size, int) or size < 1:
        return
    try:
        rows = len(sampler.sampler)  # type: ignore[union-attr]
    except (TypeError, AttributeError):  # (a sampler without a length: nothing to tell)
        return
    dropped = rows % size
    if not dropped or (limit is not None and limit < rows // size + 1):
        return
    warnings.warn(
        f"{where} is a DataLoader with drop_last=True: its last {dropped} of {rows} examples "
        f"(fewer than batch_size={size}) are never evaluated, so every metric is over "
        f"{rows - dropped} examples, not the set; evaluate with a loader of drop_last=False "
        "(keep drop_last=True for the training loader only)",
        UserWarning,
        stacklevel=outside(),
    )
