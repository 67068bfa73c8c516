"""Splitting a data set over clients: IID, label shards, Dirichlet label skew, quantity skew.

Each function is seeded and returns one list of example indices per client — plain
data that crosses process boundaries, hashes and indexes any tensor or array
(``x[parts[c]]``). The partitions are disjoint and together cover every example.
``histogram(labels, parts)`` shows what each client holds::

    parts = fl.dirichlet(labels, clients=100, alpha=0.5, seed=0)
    print(fl.histogram(labels, parts))
"""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...stack import outside

__all__ = ["Histogram", "dirichlet", "histogram", "iid", "quantity_skew", "shards"]

Parts = list[list[int]]
_TRIES = 1000  # Dirichlet draws before giving up on min_size


def _labels(labels: Any) -> np.ndarray[Any, Any]:
    """The integer class ids of a label-based split, refused with the fix when they are not.

    Raises:
        ValueError: a data set given for its labels (saying how to pass them), or
            labels that are not a non-empty 1-d sequence of integers.
    """
    if _is_dataset(labels):
        how = "ds.tensors[1] for a TensorDataset, or " if hasattr(labels, "tensors") else ""
        raise ValueError(
            f"labels must be the class ids, not a data set ({type(labels).__qualname__}); "
            f"pass its labels: {how}[y for _, y in ds] (a list of ints)"
        )
    if hasattr(labels, "detach"):  # a torch tensor
        labels = labels.detach().cpu().numpy()
    try:
        arr = np.asarray(labels)
    except (ValueError, TypeError) as e:  # ragged, or items numpy cannot hold side by side
        raise ValueError(
            f"labels must be a 1-d sequence of integer class ids; a {type(labels).__qualname__} "
            f"of uneven items is not one ({e}); pass one int per example"
        ) from e
    if arr.ndim != 1 or arr.size == 0:
        hint = "; for one-hot labels pass labels.argmax(1)" if arr.ndim == 2 else ""
        raise ValueError(f"labels must be a non-empty 1-d sequence, not shape {arr.shape}{hint}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be integers (class ids), not {arr.dtype}")
    return arr


def _is_dataset(x: Any) -> bool:
    from torch.utils.data import Dataset

    return isinstance(x, Dataset)


def _size(data: Any, fn: str) -> int:
    """The number of examples ``data`` stands for: an int, or the length of anything with
    one (a tensor or array's first dimension, a Dataset, a list) — only the count is used.
    Raises TypeError for anything else (a str too), ValueError for a negative count."""
    if isinstance(data, (int, np.integer)) and not isinstance(data, bool):
        if data < 0:
            raise ValueError(f"{fn}(data={data!r}): a count of examples cannot be negative")
        return int(data)
    if isinstance(data, (str, bytes)):  # (a path or a name: its length is no count)
        kind = type(data).__name__
        raise TypeError(f"{fn}(data={data!r:.40}): a {kind} is not data to split — pass the "
                        f"number of examples or the examples (load a file first)")  # fmt: skip
    try:
        return len(data)
    except TypeError as e:  # (a 0-d tensor or array, an iterable Dataset, a float, None)
        raise TypeError(
            f"{fn}(data=...) takes the number of examples (an int) or something with a length "
            f"(a tensor or array: its first dimension; a Dataset; a list), not a "
            f"{type(data).__qualname__} ({e}); pass the count, e.g. {fn}(len(ds), ...)"
        ) from e


def _is_int(value: Any) -> bool:
    """An int, or an integer numpy's and ``operator.index`` take (``np.int64``); never a bool."""
    if isinstance(value, (bool, np.bool_)):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _check(n: int, clients: int, min_size: int | None = None) -> None:
    """``clients`` (and ``min_size``, for a split that has one) are valid, and ``n``
    examples give each client ``min_size`` (one, for a split without the argument)."""
    if not _is_int(clients) or clients < 1:
        raise ValueError(f"clients must be a positive int, not {clients!r}")
    if min_size is None:
        if clients > n:
            raise ValueError(
                f"{n} examples cannot give {clients} clients one each; use at most {n} clients"
            )
        return
    if not _is_int(min_size) or min_size < 0:
        raise ValueError(
            f"min_size must be a non-negative int (examples per client), not {min_size!r}"
        )
    if clients * min_size > n:
        raise ValueError(
            f"{n} examples cannot give {clients} clients {min_size} each; use fewer clients "
            "or a smaller min_size"
        )


def _check_shards(n: int, clients: int, per_client: int) -> None:
    """``n`` examples can be cut into ``clients * per_client`` shards of one example or more.

    Raises:
        ValueError: a bad ``clients`` or ``per_client``, or too few examples — naming the
            ``clients`` and ``per_client`` that fit.
    """
    _check(n, clients)
    if not _is_int(per_client) or per_client < 1:
        raise ValueError(
            f"per_client must be a positive int (shards per client), not {per_client!r}"
        )
    k = clients * per_client
    if k > n:
        fits = [f"per_client={n // clients} with clients={clients}"]  # (clients <= n)
        if n // per_client:
            fits.append(f"clients={n // per_client} with per_client={per_client}")
        raise ValueError(
            f"shards cuts clients × per_client = {clients} × {per_client} = {k} shards of at "
            f"least one example each, but there are {n} examples; make clients × per_client "
            f"at most {n}: {' or '.join(fits)}"
        )


def _alpha(fn: str, alpha: Any) -> float:
    """``alpha`` as a Dirichlet concentration: a positive finite real (numpy's too).

    Raises:
        ValueError: anything else, saying what ``alpha`` does and (for inf) what to use.
    """
    large = "IID" if fn == "dirichlet" else "equal"
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
        raise ValueError(
            f"{fn}(alpha=...) is the Dirichlet concentration, a positive number (small: "
            f"skewed, large: {large}), not {alpha!r} (a {type(alpha).__qualname__}); e.g. "
            "alpha=0.5"
        )
    value = float(alpha)
    if math.isinf(value) and value > 0:
        raise ValueError(
            f"{fn}(alpha=inf): the Dirichlet concentration must be finite; alpha → ∞ is the "
            f"{large} split, which fl.iid(...) draws — or pass a large finite alpha (1e6)"
        )
    if not value > 0:
        raise ValueError(f"alpha must be positive, not {alpha!r} (small: skewed, large: {large})")
    return value


def _draw(rng: np.random.Generator, clients: int, alpha: float, fn: str) -> Any:
    """One Dirichlet(alpha) draw of ``clients`` proportions; an alpha so large that numpy's
    gamma variates overflow (their sum: inf, every share 0) is refused, not redrawn."""
    share = rng.dirichlet(np.full(clients, alpha))
    if not share.sum() > 0.5:
        raise ValueError(
            f"{fn}(alpha={alpha!r}) over {clients} clients overflows numpy's Dirichlet draw "
            "(its gamma variates sum past float64's range); a concentration this large is "
            "an even split: use fl.iid(...), or an alpha such as 1e6"
        )
    return share


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.PCG64(seed))


def _split(order: np.ndarray[Any, Any], sizes: np.ndarray[Any, Any]) -> Parts:
    return [p.tolist() for p in np.split(order, np.cumsum(sizes)[:-1])]


def _warn_empty(name: str, sizes: np.ndarray[Any, Any]) -> None:
    """With ``min_size=0`` a client may hold nothing: say which, rather than silently."""
    empty = np.flatnonzero(sizes == 0).tolist()
    if empty:
        warnings.warn(
            f"{name}(min_size=0): client(s) {empty[:10]}{' ...' if len(empty) > 10 else ''} "
            f"({len(empty)} of {len(sizes)}) hold no examples: such a client cannot train "
            "(Trainer.fit refuses data without examples, so one drawn into a round fails "
            "fl.map_clients, unless errors='return' drops it) — pass min_size=1 (the default) "
            "for at least one example each, or leave the empty clients out of sampling "
            "(weights=[len(p) for p in parts])",
            RuntimeWarning,
            stacklevel=outside(),
        )


def iid(data: Any, clients: int, *, seed: int = 0) -> Parts:
    """A uniform random split into ``clients`` parts whose sizes differ by at most one.

    Args:
        data: the number of examples, or anything with a length — a tensor or array (its
            first dimension: features, targets or labels alike), a Dataset, a list. Only
            the count is used.
        clients: how many parts.
        seed: the permutation's seed.

    Raises:
        TypeError: ``data`` is neither an int nor something with a length.
        ValueError: fewer examples than clients.

    Example:
        >>> [len(p) for p in iid(10, clients=3, seed=0)]
        [4, 3, 3]
    """
    n = _size(data, "iid")
    _check(n, clients)
    return [p.tolist() for p in np.array_split(_rng(seed).permutation(n), clients)]


def shards(labels: Any, clients: int, *, per_client: int = 2, seed: int = 0) -> Parts:
    """McMahan et al. 2017's pathological split: sort by label, cut ``clients * per_client``
    shards, give each client ``per_client`` of them at random.

    Args:
        labels: one integer class id per example (a tensor, array or list; for a
            ``TensorDataset``, ``ds.tensors[1]``).
        clients: how many parts.
        per_client: shards each client is dealt; ``clients * per_client`` may not exceed
            the number of examples.
        seed: the sort's tie-breaking and the deal's seed.

    Example:
        >>> y = [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
        >>> sorted(len(set(y[i] for i in p)) for p in shards(y, clients=2, seed=0))
        [2, 2]
    """
    y = _labels(labels)
    _check_shards(len(y), clients, per_client)
    rng = _rng(seed)
    # ties broken at random, so equal labels do not keep the data set's order
    order = np.lexsort((rng.permutation(len(y)), y))
    cut = np.array_split(order, clients * per_client)
    perm = rng.permutation(clients * per_client)
    return [
        np.concatenate([cut[j] for j in perm[c * per_client : (c + 1) * per_client]]).tolist()
        for c in range(clients)
    ]


def dirichlet(
    labels: Any, clients: int, alpha: float, *, seed: int = 0, min_size: int = 1
) -> Parts:
    """Label skew (Hsu et al. 2019): each class is split over clients in proportions
    drawn from Dirichlet(α); small α gives each client few classes, α → ∞ approaches IID.

    As in the common implementation (Wang et al. 2020's NIID-Bench), a client that
    already holds its 1/clients share of the data takes nothing from later classes,
    and the split is drawn again (up to 1,000 times, deterministically) until every
    client holds at least ``min_size`` examples.

    Example:
        >>> y = [i % 10 for i in range(1000)]
        >>> parts = dirichlet(y, clients=10, alpha=0.5, seed=0)
        >>> sum(len(p) for p in parts), min(len(p) for p in parts) >= 1
        (1000, True)
    """
    y = _labels(labels)
    _check(len(y), clients, min_size)
    alpha = _alpha("dirichlet", alpha)
    rng = _rng(seed)
    classes = [np.flatnonzero(y == k) for k in np.unique(y)]
    cap = len(y) / clients
    for _ in range(_TRIES):
        owner = np.empty(len(y), dtype=np.int64)
        held = np.zeros(clients, dtype=np.int64)
        for idx in classes:
            share = _draw(rng, clients, alpha, "dirichlet")
            share = share * (held < cap)  # a full client takes no more (as NIID-Bench does)
            if not share.sum() > 0:  # only full clients drew a share (tiny alpha): draw again
                break
            share = share / share.sum()
            ends = np.round(np.cumsum(share) * len(idx)).astype(np.int64)
            counts: np.ndarray[Any, Any] = np.diff(ends, prepend=0)
            owner[rng.permutation(idx)] = np.repeat(np.arange(clients), counts)
            held += counts
        else:  # every class dealt
            sizes = np.bincount(owner, minlength=clients)
            if sizes.min() >= min_size:
                _warn_empty("dirichlet", sizes)
                order = np.argsort(owner, kind="stable")
                return _split(order, sizes)
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) split in {_TRIES} draws gives each of {clients} clients "
        f"{min_size} examples; raise alpha, lower min_size, or use fewer clients"
    )


def quantity_skew(
    data: Any, clients: int, alpha: float, *, seed: int = 0, min_size: int = 1
) -> Parts:
    """Quantity skew: IID labels, client sizes in proportions drawn from Dirichlet(α)
    (Li et al. 2022, "Federated learning on non-IID data silos"); every client gets
    ``min_size`` examples first.

    Args:
        data: the number of examples, or anything with a length (as ``iid``'s): only the
            count is used, the labels being left IID.
        clients: how many parts.
        alpha: the Dirichlet concentration of the sizes (small: skewed, large: equal).
        seed: the draw's seed.
        min_size: examples every client gets before the skewed rest.

    Example:
        >>> parts = quantity_skew(1000, clients=4, alpha=0.5, seed=0)
        >>> sum(len(p) for p in parts), min(len(p) for p in parts) >= 1
        (1000, True)
    """
    n = _size(data, "quantity_skew")
    _check(n, clients, min_size)
    alpha = _alpha("quantity_skew", alpha)
    rng = _rng(seed)
    rest = n - clients * min_size
    share = _draw(rng, clients, alpha, "quantity_skew")
    extra = np.diff(np.round(np.cumsum(share) * rest).astype(np.int64), prepend=0)
    _warn_empty("quantity_skew", extra + min_size)
    return _split(rng.permutation(n), extra + min_size)


@dataclass(frozen=True)
class Histogram:
    """Examples of each class held by each client; ``str()`` prints a table.

    Attributes:
        classes: the class ids, in order.
        counts: one row per client, one column per class.
    """

    classes: tuple[int, ...]
    counts: tuple[tuple[int, ...], ...]

    def __str__(self, rows: int = 20) -> str:
        w = max(5, *(len(str(v)) + 1 for row in self.counts for v in row))
        head = (
            f"{'client':>6} " + "".join(f"{c:>{w}}" for c in self.classes) + f"{'total':>{w + 2}}"
        )
        lines = [head]
        for i, row in enumerate(self.counts[:rows]):
            lines.append(f"{i:>6} " + "".join(f"{v:>{w}}" for v in row) + f"{sum(row):>{w + 2}}")
        if len(self.counts) > rows:
            lines.append(f"… {len(self.counts) - rows} more clients")
        per = [sum(1 for v in row if v) for row in self.counts]
        sizes = [sum(row) for row in self.counts]
        lines.append(
            f"{len(self.counts)} clients, {sum(sizes)} examples; size {min(sizes)}–{max(sizes)}, "
            f"classes per client {min(per)}–{max(per)} (mean {sum(per) / len(per):.1f})"
        )
        return "\n".join(lines)


def histogram(labels: Any, parts: Sequence[Sequence[int]]) -> Histogram:
    """The per-client label histogram of a partition.

    Example:
        >>> h = histogram([0, 0, 1, 1], [[0, 1], [2, 3]])
        >>> h.counts
        ((2, 0), (0, 2))
    """
    y = _labels(labels)
    classes = np.unique(y)
    pos = np.searchsorted(classes, y)
    for c, p in enumerate(parts):
        idx = np.asarray(p, dtype=np.int64)
        if idx.size and not (idx.min() >= 0 and idx.max() < len(y)):
            bad = int(idx[(idx < 0) | (idx >= len(y))][0])
            raise ValueError(
                f"client {c}'s part holds {bad}, not an index of the {len(y)} labels "
                f"(0 to {len(y) - 1}); pass the labels the partition was made from, and the "
                "parts as made (index lists)"
            )
    counts = tuple(
        tuple(
            int(v) for v in np.bincount(pos[np.asarray(p, dtype=np.int64)], minlength=len(classes))
        )
        for p in parts
    )
    return Histogram(tuple(int(c) for c in classes), counts)
