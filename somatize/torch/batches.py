"""Batches: what the Trainer accepts, how it orders, shards, splits and moves them.

With a loss function, a batch is ``(x, y)``, a dict with ``"x"`` (and ``"y"``), or
anything else (the whole batch is the input and ``loss(output)`` the loss). Without
one (``loss=None``) the whole batch is the graph's input and its output the loss.
``x`` and ``y`` may be tensors or nested tuples/lists/dicts of tensors.

The Trainer owns the order: a sequence of batches is permuted per epoch by a
generator seeded with ``(seed, epoch)``; a DataLoader gets its random sampler's
generator and its own (which seeds worker processes) seeded the same way. That is
what makes resuming mid-epoch exact.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import SettingError
from . import ddp
from .limits import length
from .samplers import epoch_generator, rank_share

__all__ = [
    "check_data",
    "check_rereadable",
    "chunk",
    "epoch_batches",
    "loss_of",
    "num_examples",
    "split",
    "to_device",
]


def split(batch: Any) -> tuple[Any, Any]:
    """``(x, y)`` of a batch; ``y`` is None when the batch carries no target."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
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
        out = fn(batch)
        if type(out) is not tuple or len(out) != 2:
            raise SettingError(
                f"split={getattr(fn, '__qualname__', fn)!r} returned "
                f"{type(out).__qualname__}{'' if type(out) is not tuple else f' of {len(out)}'}"
                ", not an (inputs, target) pair; return a 2-tuple, with None as the target "
                "for a loss of the output alone"
            )
        return out

    return pair


def loss_of(loss: Callable[..., Any] | None, output: Any, target: Any) -> torch.Tensor:
    """The scalar loss of a batch: ``loss(output, target)``, ``loss(output)`` without a
    target, or the output itself when there is no loss function (the graph computes it).

    Raises:
        TypeError: the result is not a scalar tensor.
    """
    if loss is None:
        value = output
    elif target is None:
        value = loss(output)
    else:
        value = loss(output, target)
    if loss is None and isinstance(value, Mapping) and "loss" in value:
        raise SettingError(_holds_loss(value))
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
        raise TypeError(
            f"the loss must be a scalar tensor, got {type(value).__name__}{shape}; "
            "pass loss=fn(output, target) returning a mean, or make the graph output the loss"
        )
    return value


def _holds_loss(output: Mapping[Any, Any]) -> str:
    """Without ``loss=``, an output that holds its loss (a Hugging Face model's)."""
    keys = ", ".join(map(repr, list(output)[:4])) + (", ..." if len(output) > 4 else "")
    return (
        f"the model returned a {type(output).__qualname__} ({keys}), not its loss: without "
        "loss= the model's output is the loss, a scalar tensor. Return out['loss'] from the "
        "model, or pick it out with loss=lambda out: out['loss'], split=lambda batch: "
        "(batch, None) — the model still gets the whole batch, and the loss is called "
        "with its output alone"
    )


def _map(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _map(fn, v) for k, v in value.items()}
    return value


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
    """The batch size: the first dimension of the batch's first tensor (1 if it has none)."""
    if type(batch) is torch.Tensor:
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    leaves = _leaves(split(batch)[0]) or _leaves(batch)
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() > 0 else 1


def check_data(
    data: Any, what: str, split_: Callable[[Any], tuple[Any, Any]], *, train: bool = False
) -> None:
    """Refuse a torch ``Dataset`` of single examples where batches belong (``what`` names
    the argument: ``"fit()'s train"``, ``"val set 'a'"``...). Read by index, it would give each step
    one un-batched example — which ``nn.Linear`` and ``F.cross_entropy`` take without a
    complaint — and ``num_examples`` would count the first tensor's first dimension: the
    features.

    A ``TensorDataset`` holds rows (so does a ``Subset`` or ``ConcatDataset`` of them,
    what ``random_split`` gives); another map-style dataset is refused when its first item's
    target (by ``split_``) is a 0-d tensor or a number. Its items are then examples, not
    batches; a dataset of batches (targets with a batch dimension), an ``IterableDataset``,
    a DataLoader and a list of batches pass. A DataLoader that does not batch
    (``batch_size=None``) is refused as its dataset would be by the target rule.

    Raises:
        SettingError: naming the dataset and the fix, ``DataLoader(ds, batch_size=...)``;
            or ``data`` is None, a string or nothing that yields batches.
    """
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    readable = isinstance(data, Iterable) or hasattr(type(data), "__getitem__")
    if data is None or isinstance(data, (str, bytes)) or not readable:
        raise SettingError(
            f"{what} is {type(data).__qualname__}, not batches; pass a sequence of batches "
            "or a DataLoader, e.g. DataLoader(TensorDataset(X, Y), batch_size=32)"
        )
    if isinstance(data, torch.Tensor):
        _refuse_tensor(data, what)
    if isinstance(data, Mapping) and any(isinstance(v, torch.Tensor) for v in data.values()):
        keys = ", ".join(map(repr, list(data)[:3])) + (", ..." if len(data) > 3 else "")
        raise SettingError(  # (read as data, a dict gives its keys)
            f"{what} is one dict batch ({keys}), not batches: read as data, it would "
            f"give its keys; pass [batch] for one batch, or a DataLoader over the examples"
        )
    if type(data) in (list, tuple) and any(isinstance(b, (DataLoader, Dataset)) for b in data):
        _refuse_loaders(data, what, train)
    if type(data) in (list, tuple) and data and _an_example(data[0], split_, listed=True):
        _refuse_examples(data, what, train)
    loader = None
    if isinstance(data, DataLoader) and data.batch_size is None and data.batch_sampler is None:
        loader, data = data, data.dataset  # not batching: its items are the batches
    if not isinstance(data, Dataset) or isinstance(data, IterableDataset):
        return
    item = _first(data)
    if (loader is not None or not _rows(data)) and not _an_example(item, split_, listed=False):
        return
    from .first_step import describe

    shape = f" (each item {describe(item, 1)})" if item is not None else ""
    size = f" of {n} examples" if isinstance(n := length(data), int) else ""
    shuffle = ", shuffle=True" if train else ""
    kind = "a DataLoader with batch_size=None over a" if loader is not None else "a"
    raise SettingError(
        f"{what} is {kind} torch Dataset ({type(data).__qualname__}){size}{shape}, whose items are single "
        "examples, but the Trainer reads batches: each step would see one un-batched "
        "example and the run would count its features as its examples. Wrap it in a "
        f"DataLoader: DataLoader(dataset, batch_size=32{shuffle}) (a dataset whose items are "
        "batches already: DataLoader(dataset, batch_size=None))"
    )


def check_rereadable(train: Any, epochs: int | None, max_steps: int | None) -> None:
    """A one-shot iterator (a generator) as ``train`` is used up by the first epoch: refused
    before any step when the run plans more than one epoch, as ``val=`` is
    (``valsets.check_reusable``); with ``max_steps`` the run may end within the first epoch
    (a stream), so it is left to the loop's check at the second epoch's start.

    Raises:
        SettingError: naming the iterator, the epochs and the fixes.
    """
    if isinstance(train, Iterator) and epochs is not None and epochs > 1 and max_steps is None:
        raise SettingError(
            f"fit()'s train is a {type(train).__qualname__}, an iterator the first epoch "
            f"uses up, and this run has epochs={epochs}; pass a list of batches (list(...) "
            "of it) or a DataLoader, which can be read again — or, for a stream, "
            "epochs=None with max_steps=N"
        )


def _refuse_tensor(data: torch.Tensor, what: str) -> None:
    """One tensor where batches belong: each of its rows would be one un-batched batch
    (``predict(g, X)`` would predict row by row, without a complaint)."""
    one, loader = (
        ("[X]", "TensorDataset(X)")
        if what.startswith("predict")
        else (
            "[(X, Y)]",
            "TensorDataset(X, Y)",
        )
    )
    rows = f"its {data.shape[0]} rows" if data.dim() else "it"
    raise SettingError(
        f"{what} is one tensor of shape {tuple(data.shape)}, but data is read as a sequence "
        f"of batches: each of {rows} would be one un-batched batch. Pass {one} for one "
        f"batch, or DataLoader({loader}, batch_size=32)"
    )


def _an_example(item: Any, split_: Callable[[Any], tuple[Any, Any]], listed: bool) -> bool:
    """Whether ``item`` (a dataset's or a list's first) is one example: its target (by
    ``split_``) is a 0-d tensor or a number, where a batch's has a batch dimension; in a
    list, its input holds a tensor too (one without is refused at the first step, saying
    so), where a dataset's may be an image for its DataLoader's transforms."""
    try:
        x, target = split_(item) if item is not None else (None, None)
    except Exception:  # the split's own error, at the first step, says it better
        return False
    one = isinstance(target, torch.Tensor) and target.dim() == 0
    return (one or isinstance(target, numbers.Number)) and (not listed or bool(_leaves(x)))


def _refuse_examples(data: list[Any] | tuple[Any, ...], what: str, train: bool) -> None:
    """A list of single examples (``list(zip(xs, ys))``) where a list of batches belongs."""
    from .first_step import describe

    kind = type(data).__name__
    shuffle = ", shuffle=True" if train else ""
    raise SettingError(
        f"{what} is a {kind} of {len(data)} items, each a single example "
        f"({describe(data[0], 1)}: its target has no batch dimension), but a {kind} is read "
        "as a sequence of batches: each step would see one un-batched example and the run "
        "would count its features as its examples. Batch it: DataLoader(examples, "
        f"batch_size=32{shuffle}) reads a {kind} of (x, y) pairs as a dataset"
    )


def _refuse_loaders(data: list[Any] | tuple[Any, ...], what: str, train: bool) -> None:
    """A list of DataLoaders (Lightning's several validation loaders) where batches belong."""
    kinds = ", ".join(sorted({type(b).__qualname__ for b in data}))
    if what == "fit()'s val":
        fix = (
            "pass several validation sets as a dict of name to loader, val={'a': loader_a, "
            "'b': loader_b} (evaluated as val_a_loss, val_b_loss...), or one as val=loader"
        )
    elif train:
        fix = (
            "pass one DataLoader; to train on several datasets, one over "
            "ConcatDataset([ds_a, ds_b])"
        )
    else:
        fix = "pass one DataLoader (or a list of its batches), one data set at a time"
    raise SettingError(
        f"{what} is a {type(data).__name__} of {len(data)} items ({kinds}), but a "
        f"{type(data).__name__} is read as a sequence of batches, each item one batch; {fix}"
    )


def _rows(data: Any) -> bool:
    """Whether ``data`` is a ``TensorDataset``, or a ``Subset``/``ConcatDataset`` of them."""
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    if isinstance(data, Subset):
        return _rows(data.dataset)
    if isinstance(data, ConcatDataset):
        return all(_rows(d) for d in data.datasets)
    return isinstance(data, TensorDataset)


def _first(data: Any) -> Any:
    """``data[0]``, read leaving every RNG as it was (an item may be augmented at random);
    None when it cannot be read."""
    from .rng import put_back, snapshot

    kept = snapshot()
    try:
        return data[0]
    except Exception:  # empty, or not indexed by int: the loop's own error says it
        return None
    finally:
        put_back(kept)


def chunk(value: Any, k: int) -> list[Any]:
    """Split every tensor of a (nested) value into ``k`` chunks along dim 0 with ``torch.chunk``.

    ``torch.chunk`` may return fewer than ``k`` chunks (for a batch smaller than ``k``,
    or sizes that do not divide); every leaf is chunked alike, so the parts line up.
    """
    leaves = _leaves(value)
    if not leaves:
        return [value]
    n = len(torch.chunk(leaves[0], k))
    return [_map(lambda t, i=i: torch.chunk(t, k)[i], value) for i in range(n)]  # type: ignore[misc]


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
    gen = epoch_generator(seed, epoch)
    if isinstance(data, Sequence):
        n = len(data)
        order: list[int] = torch.randperm(n, generator=gen).tolist() if shuffle else list(range(n))
        if world > 1:
            order = order[: n - n % world if even else n][rank::world]
        return (data[i] for i in order)
    sampler = getattr(data, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler):
        sampler.generator = gen
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
