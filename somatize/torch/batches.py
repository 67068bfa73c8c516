"""Batches: what the Trainer accepts, how it orders, shards, splits and moves them.

With a loss function, a batch is ``(x, y)``, a dict with ``"x"`` (and ``"y"``), or
anything else (the whole batch is the input and ``loss(output)`` the loss). Without
one (``loss=None``) the whole batch is the graph's input and its output the loss.
``x`` and ``y`` may be tensors or nested tuples/lists/dicts of tensors.

What the Trainer refuses as data (a dataset of single examples, a stream it cannot
read twice) is checked in ``data_checks.py``.

The Trainer owns the order: a sequence of batches is permuted per epoch by a
generator seeded with ``(seed, epoch)``; a DataLoader gets its random sampler's
generator and its own (which seeds worker processes) seeded the same way. That is
what makes resuming mid-epoch exact.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import SettingError, add_note
from ..printable import printable
from . import ddp
from .limits import length
from .loss_terms import loss_terms
from .samplers import epoch_generator, rank_share

__all__ = [
    "chunk",
    "epoch_batches",
    "loss_of",
    "num_examples",
    "split",
    "to_device",
]


def split(batch: Any) -> tuple[Any, Any]:
    """``(x, y)`` of a batch; ``y`` is None when the batch carries no target. A batch of
    raw text alone (``is_text``: two strings, ``["a dish", "the coach"]``) is its input
    whole, not a text and its target."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        first = type(batch[0])  # (a str first, seldom: only then is the whole read)
        if (first is not str and first is not bytes) or not is_text(batch):
            return batch[0], batch[1]
    if isinstance(batch, dict) and "x" in batch:
        return batch["x"], batch.get("y")
    return batch, None


def checked_split(
    fn: Callable[[Any], Any] | None, loss: Any, owner: str = "Trainer"
) -> Callable[[Any], tuple[Any, Any]] | None:
    """``Trainer(split=fn)`` (or ``LightningGraph``'s: ``owner``), checked: a function, given
    with a loss, whose every result is an ``(inputs, target)`` pair (None: the default
    ``split``)."""
    if fn is None:
        return None
    if not callable(fn):
        raise SettingError(
            f"split must be a function of a batch returning (inputs, target), not "
            f"{type(fn).__qualname__}; e.g. split=lambda b: (b['input'], b['labels'])"
        )
    if loss is None:
        raise SettingError(
            f"split= gives a loss function its target, but the {owner} has no loss=: without "
            "one the graph gets the whole batch and computes the loss itself; pass loss=, or "
            "leave split out"
        )

    def pair(batch: Any) -> tuple[Any, Any]:
        try:
            out = fn(batch)
        except Exception as e:  # (the user's function: a key the batch lacks)
            add_note(e, _split_failed(fn, batch))
            raise
        if type(out) is not tuple or len(out) != 2:
            raise SettingError(
                f"split={getattr(fn, '__qualname__', fn)!r} returned "
                f"{type(out).__qualname__}{'' if type(out) is not tuple else f' of {len(out)}'}"
                ", not an (inputs, target) pair; return a 2-tuple, with None as the target "
                "for a loss of the output alone"
            )
        return out

    return pair


def _split_failed(fn: Callable[[Any], Any], batch: Any) -> str:
    """The note on an error ``split=fn`` raised: what the batch it was given holds."""
    if isinstance(batch, Mapping):
        keys = ", ".join(printable(repr(k)) for k in list(batch)[:8])
        held = f"a {type(batch).__qualname__} with the keys {keys}" + (
            ", ..." if len(batch) > 8 else ""
        )
    elif isinstance(batch, (tuple, list)):
        held = f"a {type(batch).__qualname__} of {len(batch)}"
    else:
        held = f"a {type(batch).__qualname__}"
    return (
        f"raised by split={getattr(fn, '__qualname__', fn)!r}, given {held}: it gets each batch "
        "as the data yields it (after the DataLoader's collate_fn) — in training, the sanity "
        "check, evaluate and predict alike"
    )


def loss_of(loss: Callable[..., Any] | None, output: Any, target: Any) -> torch.Tensor:
    """The scalar loss of a batch: ``loss(output, target)``, ``loss(output)`` without a
    target, or the output itself when there is no loss function (the graph computes it).
    A loss function's dict gives its ``"loss"`` entry (its terms: ``loss_terms.py``).

    Raises:
        TypeError: the result is not a scalar tensor, nor such a dict.
    """
    return loss_terms(loss, output, target)[0]


def _map(
    fn: Callable[[torch.Tensor], Any], value: Any, text: Callable[[Any], Any] | None = None
) -> Any:
    """``fn`` on every tensor of a (nested) batch, rebuilding its containers as their own
    types: tuples, namedtuples, lists, dicts and other mappings (a tokenizer's
    ``BatchEncoding``), dataclass instances (by their ``init`` fields); and ``text``, if
    given, on each batch of raw text in it (``is_text``)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if text is not None and is_text(value):
        return text(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple: by position
        return type(value)(*(_map(fn, v, text) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v, text) for v in value)
    if isinstance(value, Mapping):
        out = {k: _map(fn, v, text) for k, v in value.items()}
        if type(value) is dict:
            return out
        try:  # (OrderedDict, BatchEncoding...; a defaultdict cannot be made from a dict)
            return type(value)(out)  # type: ignore[call-arg]
        except Exception:
            return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f.name for f in dataclasses.fields(value) if f.init]
        return dataclasses.replace(value, **{f: _map(fn, getattr(value, f), text) for f in fields})
    return value


def is_text(value: Any) -> bool:
    """Whether ``value`` is a batch of raw text: a list (or tuple) of strings, as a
    DataLoader collates a dataset's strings — a row per example, for a graph whose first
    node tokenizes them."""
    return (
        type(value) in (list, tuple)
        and bool(value)
        and all(type(v) is str or type(v) is bytes for v in value)
    )


def text_rows(value: Any) -> int | None:
    """The rows of the first batch of raw text in a (nested) batch (``is_text``), or None."""
    found = _texts(value)
    return found[0] if found else None


def _texts(value: Any) -> list[int]:
    """The rows of each batch of raw text in a (nested) batch, in order."""
    found: list[int] = []

    def seen(rows: Any) -> Any:
        found.append(len(rows))
        return rows

    _map(lambda t: t, value, seen)
    return found


def to_device(value: Any, device: torch.device | None) -> Any:
    """Move every tensor of a (nested) batch to ``device``."""
    if device is None:
        return value
    if type(value) is torch.Tensor:  # the common case, without a call per tensor
        return value if value.device == device else value.to(device, non_blocking=True)
    return _map(lambda t: t if t.device == device else t.to(device, non_blocking=True), value)


def _leaves(value: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _map(out.append, value)
    return out


def num_examples(batch: Any) -> int:
    """The batch size: the first dimension of the batch's first tensor that has one (a
    scalar beside the batch, a temperature, counts no rows), else the length of its raw
    text (a list of strings); 1 if it has neither."""
    if type(batch) is torch.Tensor:
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    leaves = _leaves(split(batch)[0]) or _leaves(batch)
    n = next((int(t.shape[0]) for t in leaves if t.dim() > 0), None)
    return n if n is not None else text_rows(batch) or 1


def chunk(value: Any, k: int) -> list[Any]:
    """Split every tensor of a (nested) value into ``k`` chunks along dim 0 with ``torch.chunk``
    (``micro_batches=k``); a scalar tensor goes whole into every chunk.

    ``torch.chunk`` may return fewer than ``k`` chunks (for a batch smaller than ``k``,
    or sizes that do not divide); every leaf is chunked alike, so the parts line up — a
    batch of raw text (a list of strings) too, as ``torch.chunk`` cuts its rows.

    Raises:
        SettingError: the tensors (and raw text) disagree on their first dimension (a mask
            shared by the batch's rows beside them, towers given batches of different
            sizes): chunked alike, their parts would not line up — each chunk's mask a few
            of its rows.
    """
    leaves = [t for t in _leaves(value) if t.dim() > 0]
    texts = _texts(value)
    if not leaves and not texts:
        return [value]
    rows = {int(t.shape[0]) for t in leaves} | set(texts)
    if len(rows) > 1:
        raise SettingError(_misfit(value, k))
    (count,) = rows
    size = -(-count // k)  # torch.chunk's: ceil(count / k) rows a chunk
    n = -(-count // size) if size else 1
    return [
        _map(
            lambda t, i=i: torch.chunk(t, k)[i] if t.dim() else t,  # type: ignore[misc]
            value,
            lambda rows, i=i: type(rows)(rows[i * size : (i + 1) * size]),  # type: ignore[misc]
        )
        for i in range(n)
    ]


def _misfit(value: Any, k: int) -> str:
    """Why ``value`` cannot be cut into ``k`` micro-batches: its tensors, named by where they
    sit, disagree on their first dimension."""
    found: list[tuple[str, int, str]] = []  # (where, rows, what: a shape or raw text)

    def at(v: Any, path: str) -> None:
        if isinstance(v, torch.Tensor):
            if v.dim():
                found.append((path, int(v.shape[0]), f"of shape {tuple(v.shape)}"))
        elif is_text(v):
            found.append((path, len(v), f"of {len(v)} strings"))
        elif isinstance(v, (tuple, list)):
            for i, item in enumerate(v):
                at(item, f"{path}[{i}]")
        elif isinstance(v, Mapping):
            for key, item in v.items():
                at(item, f"{path}[{key!r}]")

    at(value, "inputs")
    first, other = found[0], next(f for f in found if f[1] != found[0][1])
    shown = " and ".join(f"{p} {what}" for p, _, what in (first, other))
    return (
        f"micro_batches={k} cuts every tensor of a batch along its first dimension, but "
        f"{shown} disagree on it, so their parts would not line up (a mask shared by every "
        "row would be cut into rows). Give every tensor the batch's rows first (a shared "
        "mask expanded, mask.expand(batch, *mask.shape), or held by its node), or train "
        "without micro-batches: smaller batches and Options(accumulate=k)"
    )


def epoch_batches(
    data: Iterable[Any],
    epoch: int,
    seed: int,
    shuffle: bool,
    rank: int = 0,
    world: int = 1,
    *,
    even: bool = True,
) -> Iterator[Any]:
    """The batches of one epoch, in the Trainer's order: this rank's share.

    Args:
        data: a sequence of batches, or an iterable such as a DataLoader.
        epoch, seed: seed the order (a sequence's permutation, a DataLoader's generators).
        shuffle: permute a sequence (a DataLoader shuffles per its own sampler).
        rank, world: take every ``world``-th batch, starting at ``rank`` — unless the
            DataLoader's sampler reads only this rank's share (``ddp.shard`` gives a loader
            one; ``samplers.reads_share``); it is ``set_epoch``-ed.
        even: give every rank the same number of batches (dropping at most
            ``world - 1``), as training needs — DDP waits on every rank each step. The
            batches are read in rounds of ``world``; a rank takes its batch of a round once
            the round is full, and for data without a length (an iterable, a loader over an
            ``IterableDataset``) the ranks agree on that each round (one all-reduce), so
            they stop at the same step even if their streams differ in length.
    """
    if isinstance(data, Sequence):  # (its generator is made only to shuffle)
        n = len(data)
        order: list[int] = (
            torch.randperm(n, generator=epoch_generator(seed, epoch)).tolist()
            if shuffle
            else list(range(n))
        )
        if world > 1:
            order = order[: n - n % world if even else n][rank::world]
        return (data[i] for i in order)
    sampler = getattr(data, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler):
        sampler.generator = epoch_generator(seed, epoch)
    share = rank_share(data)
    if share is not None and hasattr(share, "set_epoch"):
        share.set_epoch(epoch)  # a new permutation each epoch
    if isinstance(data, torch.utils.data.DataLoader):
        # iter() draws the workers' base seed from this generator, or else from the global
        # torch RNG, which would then differ between a resumed run and an uninterrupted one
        data.generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 500_009)
    it: Iterator[Any] = iter(data)
    if world == 1 or share is not None:
        return it
    if not even:  # no sampler to shard by: every rank reads, keeps its share
        return (b for i, b in enumerate(it) if i % world == rank)
    return _rounds(it, rank, world, agree=length(data) is None)


def _rounds(it: Iterator[Any], rank: int, world: int, *, agree: bool) -> Iterator[Any]:
    """Batch ``rank`` of each full round of ``world`` batches; with ``agree``, only while
    every rank has a full round (one all-reduce a round)."""
    while True:
        batches = list(itertools.islice(it, world))
        full = len(batches) == world
        if agree:
            short = ddp.total(torch.tensor([0 if full else 1]))
            full = int(short.item()) == 0
        if not full:
            return
        yield batches[rank]
