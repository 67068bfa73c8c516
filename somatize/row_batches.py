"""A batch seen as rows: its leaves (the values a row codec knows), their structure, and
where it lives. ``somatize/rows.py`` remembers a node row by row over these.

A batch is one leaf, or a tuple, list or dict (str keys) of leaves with the same number
of rows; so is a node's output. The engine knows no tensor: a codec offers rows through
a ``rows`` attribute shaped like ``RowCodec`` (``somatize.torch``: tensors, along dim 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .errors import CacheError

__all__ = [
    "Leaf",
    "RowCodec",
    "device_of",
    "one_per_example",
    "place",
    "transposed",
    "unbatched",
    "versions",
]


class RowCodec(Protocol):
    """What a codec offers per-example memory, as its ``rows`` attribute.

    It may also offer ``version(value) -> int | None``, a counter that in-place writes
    move (torch's version counter): a node cached per example that writes into its input
    is then warned about (``wrote_input``)."""

    def count(self, value: Any) -> int:
        """Rows along the first dimension (``ValueError`` if the value has none)."""
        ...

    def layout(self, value: Any) -> Any:
        """One row's dtype and shape, as plain data."""
        ...

    def keys(self, value: Any, salt: bytes) -> list[str]:
        """One hex key per row: blake3 keyed by ``salt`` (32 bytes) over the row's bytes."""
        ...

    def digests(self, value: Any) -> list[bytes]:
        """One 32-byte blake3 digest per row (for batches of several leaves)."""
        ...

    def rows(self, value: Any) -> tuple[memoryview, int]:
        """Every row's bytes on the CPU, in order, and the bytes of one row."""
        ...

    def take(self, value: Any, index: Sequence[int]) -> Any:
        """The rows at ``index``, stacked, where ``value`` lives."""
        ...

    def build(self, layout: Any, raw: bytearray, n: int, device: str | None) -> Any:
        """``n`` rows of ``layout`` from their concatenated bytes, on ``device``."""
        ...

    def scatter(self, parts: Sequence[tuple[Sequence[int], Any]], n: int) -> Any:
        """``n`` rows assembled from (positions, rows) parts."""
        ...

    def device(self, value: Any) -> str | None:
        """Where the value lives."""
        ...

    def move(self, value: Any, device: str) -> Any:
        """The value on ``device`` (itself if it is there already)."""
        ...


Leaf = tuple[str, RowCodec, Any]  # codec tag, its rows, the value


def _leaf(value: Any, codecs: Sequence[Any]) -> Leaf | None:
    for c in codecs:
        rows = getattr(c, "rows", None)
        if rows is not None and c.accepts(value):
            return c.tag, rows, value
    return None


def _split(
    value: Any, codecs: Sequence[Any], label: str, what: str
) -> tuple[str, tuple[Any, ...], list[Leaf], int]:
    """(kind, field names, leaves, rows) of a batch; a clear error if it is not one."""
    leaf = _leaf(value, codecs)
    names: tuple[Any, ...] = ()
    items: list[Any] = []
    if leaf is not None:
        kind, leaves = "leaf", [leaf]
    else:
        if type(value) in (tuple, list):
            kind, items = type(value).__name__, list(value)
        elif type(value) is dict and all(type(k) is str for k in value):
            kind, names = "dict", tuple(sorted(value))
            items = [value[k] for k in names]
        else:
            kind = ""
        found = [_leaf(v, codecs) for v in items]
        if not items or any(f is None for f in found):
            fix = _fix(value, items, found, what, codecs)
            raise CacheError(
                f"node {label!r} is cached per example but its {what} is "
                f"{_describe(value)}; per-example memory takes a tensor batch, or a tuple, "
                f"list or dict of tensors with the same first dimension — {fix}, or cache it "
                f"per batch: g.cache({label!r})"
            )
        leaves = [f for f in found if f is not None]
    counts = set()
    for _, rows, v in leaves:
        try:
            counts.add(rows.count(v))
        except ValueError as e:
            raise CacheError(
                f"node {label!r} is cached per example but its {what} has no rows ({e}); "
                f"give it a batch dimension, or cache it per batch: g.cache({label!r})"
            ) from None
    if len(counts) != 1:
        raise CacheError(
            f"node {label!r} is cached per example but the tensors of its {what} have "
            f"different numbers of rows ({sorted(counts)}); every tensor of a batch needs the "
            f"same first dimension{one_per_example(kind, leaves, what)}, or cache it per batch: "
            f"g.cache({label!r})"
        )
    return kind, names, leaves, counts.pop()


def one_per_example(kind: str, leaves: list[Leaf], what: str) -> str:
    """The fix for a list of one example's tensors each (token ids of several lengths): a
    tuple or list is read as the fields of one batch, so its tensors' lengths are rows."""
    if kind not in ("tuple", "list") or len(leaves) < 2:
        return ""
    if len({(lay[0], len(lay[1])) for lay in (r.layout(v) for _, r, v in leaves)}) != 1:
        return ""  # (fields of their own dtypes or ranks: ids beside a mask, not sequences)
    make = "pad them" if what == "input" else "return them padded"
    return (
        f" (a {kind} of {len(leaves)} tensors, one per example? a {kind} is read as the "
        f"fields of one batch, each holding a row per example: {make} into one tensor, "
        "torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True) with a mask of the lengths "
        "beside it, or torch.stack them if they have one shape)"
    )


_FEW_FIELDS = 5  # a tuple of fields has a few, (mu, logvar), (z, mu, logvar); a batch more rows


def transposed(label: str, kind: str, leaves: list[Leaf], n: int) -> CacheError | None:
    """The error for an output that may be one tensor per example read as fields: a tuple
    or list of ``n`` tensors of one row layout, for a batch of ``n`` rows (5 or more: fewer
    is taken for fields, as a final batch of 2 meets ``(mu, logvar)``). Read as fields
    (as a tuple or list is), its rows would be columns across the examples, remembered and
    then served to other examples after a shuffle; nothing in its shape tells the two
    apart, so it is refused rather than guessed. None for any other output."""
    if kind not in ("tuple", "list") or n < _FEW_FIELDS or len(leaves) != n:
        return None  # (few: (mu, logvar) meeting a last batch of 2 rows is fields)
    first = leaves[0][1].layout(leaves[0][2])
    if any(r.layout(v) != first for _, r, v in leaves[1:]):
        return None
    return CacheError(
        f"node {label!r} is cached per example and returned a {kind} of {n} tensors of one "
        f"shape for a batch of {n} rows: per-example memory reads a {kind} as the fields of "
        "one batch, each tensor holding a row per example, so were these one tensor per "
        "example, each row remembered would be a column across the examples, served to "
        "other examples after a shuffle. One output per example: return them as one tensor, "
        "torch.stack(outputs) (or the batch's output before it was split); fields of one "
        "batch: return them as a dict, {'mu': mu, 'logvar': logvar}, whose fields are "
        f"named; or cache it per batch: g.cache({label!r})"
    )


def unbatched(kind: str) -> str:
    """The other likely cause of a node giving another number of rows than a lone tensor
    had: one example passed without its batch dimension (``g.explain(x[0])``, an image of
    3 channels read as 3 rows)."""
    if kind != "leaf":
        return ""
    return (
        "; or, if the input was one example without its batch dimension (its first "
        "dimension is read as rows), give it one: x.unsqueeze(0)"
    )


def _nests(value: Any, codecs: Sequence[Any]) -> bool:
    """Whether ``value`` is a tuple, list or dict holding a leaf (a batch in a batch)."""
    inner = value.values() if type(value) is dict else value if type(value) in (tuple, list) else ()
    return any(_leaf(v, codecs) is not None or _nests(v, codecs) for v in inner)


def _fix(
    value: Any, items: list[Any], found: list[Leaf | None], what: str, codecs: Sequence[Any]
) -> str:
    """The fix for a batch (``what``: ``"input"`` or ``"output"``) that is not one of rows."""
    # a batch in a batch (a list of examples' dicts as an input is a list of items, below)
    mixed = what == "output" or type(value) is dict or any(f is not None for f in found)
    if mixed and any(_nests(v, codecs) for v in items):
        return (
            f"flatten it into one tuple, list or dict of tensors ({{'a': {{'b': t}}}} as "
            f"{{'a.b': t}}{', a node before it can do that' * (what == 'input')})"
        )
    if not any(f is not None for f in found):
        if what == "input":
            return "use .mapped() for a list of items"
        return "return a tensor (torch.as_tensor) for a batch of numbers"
    if what == "output":  # tensors beside other items (None, a count, a string)
        return (
            "return only its tensors: drop the other items (a None, a count, a name) or "
            "make them tensors with one value per row"
        )
    picked = ""
    if type(value) is dict and len(items) == len(found):  # (sorted names: as _split reads)
        keys = ", ".join(repr(k) for k, f in zip(sorted(value), found) if f is not None)
        picked = f" (Pick({keys}) >> node: from somatize import Pick):"
    return (  # tensors beside other fields (ids, strings): a batch with extras
        f"give the node only its tensors{picked} keep the other fields out of its input "
        "(Trainer(split=...), the collate_fn, or a node before it that picks the "
        "tensors), or make them tensors"
    )


def _describe(value: Any) -> str:
    """``a tuple whose item 1 is a int`` (the first item that is not a tensor), ``a list``,
    ``a dict whose key 0 is an int``."""
    t = type(value)
    odd_key = next((k for k in value if type(k) is not str), None) if t is dict else None
    if odd_key is not None:
        name = type(odd_key).__name__
        return (
            f"a dict whose key {odd_key!r} is a{'n' * (name[0] in 'aeiou')} {name} (a batch dict needs "
            "str keys: {'image': ..., 'meta': ...})"
        )
    items = (
        list(value.items()) if t is dict else list(enumerate(value)) if t in (list, tuple) else []
    )
    odd = next(((k, v) for k, v in items if type(v).__name__ != "Tensor"), None)
    if odd is not None:
        what = "None" if odd[1] is None else _a(type(odd[1]).__name__)
        return f"a {t.__name__} whose item {odd[0]!r} is {what}"
    return _a(t.__name__)


def _a(name: str) -> str:
    """``a list``, ``an ndarray (torch.from_numpy(...) makes it a tensor)``."""
    numpy = " (torch.from_numpy(...) makes it a tensor)" * (name == "ndarray")
    return f"a{'n' * (name[0] in 'aeiou' or name == 'ndarray')} {name}{numpy}"


def _rebuild(kind: str, names: tuple[Any, ...], leaves: list[Any]) -> Any:
    if kind == "leaf":
        return leaves[0]
    if kind == "dict":
        return dict(zip(names, leaves))
    return tuple(leaves) if kind == "tuple" else list(leaves)


def device_of(value: Any, codecs: Sequence[Any]) -> str | None:
    """The device of the first leaf of ``value`` a row codec knows (None if none)."""
    leaf = _leaf(value, codecs)
    if leaf is not None:
        return leaf[1].device(value)
    if type(value) in (tuple, list):
        return next((d for v in value if (d := device_of(v, codecs)) is not None), None)
    if type(value) is dict:
        return next((d for v in value.values() if (d := device_of(v, codecs)) is not None), None)
    return None


def place(value: Any, device: str | None, codecs: Sequence[Any]) -> Any:
    """``value`` with every leaf a row codec knows moved to ``device`` (None: unchanged)."""
    if device is None:
        return value
    leaf = _leaf(value, codecs)
    if leaf is not None:
        return leaf[1].move(value, device)
    if type(value) in (tuple, list):
        return type(value)(place(v, device, codecs) for v in value)
    if type(value) is dict:
        return {k: place(v, device, codecs) for k, v in value.items()}
    return value


def versions(leaves: list[Leaf]) -> list[Any]:
    """The in-place write counter of each leaf (None where its codec keeps none)."""
    out = []
    for _, rows, v in leaves:
        version = getattr(rows, "version", None)
        out.append(version(v) if version is not None else None)
    return out
