"""What the Trainer refuses as data, before any step: a torch ``Dataset`` (or a list) of
single examples where batches belong, a tensor given whole, a list of strings (texts
where batches of them belong), a list of DataLoaders, and a one-shot stream (a generator)
for more than one epoch."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..errors import SettingError
from ..printable import printable
from .batches import _leaves
from .limits import length

__all__ = ["check_data", "check_rereadable"]


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
    readable = isinstance(data, Iterable) or hasattr(type(data), "__getitem__")
    if not readable and callable(getattr(data, "train_dataloader", None)):
        raise SettingError(  # (a LightningDataModule, or anything shaped as one)
            f"{what} is {type(data).__qualname__}, a data module, not batches: pass its "
            f"loaders, here {_module_loaders(what, train)}"
        )
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
    if type(data) in (list, tuple) and data and isinstance(data[0], (str, bytes)):
        _refuse_strings(data, what)
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


def _module_loaders(what: str, train: bool) -> str:
    """The loader of a data module to pass as ``what``, with the ``setup`` stage Lightning
    would call before it (``fit`` for training and its validation)."""
    if what.startswith("predict"):
        return (
            "dm.predict_dataloader() — dm.setup('predict'), then "
            "predict(g, dm.predict_dataloader())"
        )
    if what.startswith("evaluate"):
        return (
            "dm.val_dataloader() — dm.setup('validate'), then evaluate(g, dm.val_dataloader()) "
            "(a test set: dm.setup('test'), then evaluate(g, dm.test_dataloader()))"
        )
    return (
        f"dm.{'train' if train else 'val'}_dataloader() — dm.setup('fit'), then "
        "fit(g, dm.train_dataloader(), val=dm.val_dataloader())"
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
    held = bool(_leaves(x)) or isinstance(x, (str, bytes))  # a tensor, or one text
    return (one or isinstance(target, numbers.Number)) and (not listed or held)


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


def _refuse_strings(data: list[Any] | tuple[Any, ...], what: str) -> None:
    """A list of strings where batches belong: each string would be one batch, whose
    characters a tokenizing node would read as its rows (``predict(g, ["a dish", ...])``)."""
    kind = type(data).__name__
    raise SettingError(
        f"{what} is a {kind} of {len(data)} strings ({printable(repr(data[0][:40]))}, ...), "
        f"but a {kind} is read as a sequence of batches: each string would be one batch, "
        "its characters read as rows. Pass [texts] for one batch of raw text, or a "
        "DataLoader(texts, batch_size=32) for batches of it"
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
