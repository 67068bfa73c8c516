"""How per-example memory stores one example's output: an entry, and its layout.

An entry is a prefix — a magic, the layout's length and the layout (the output's
structure, each leaf's codec, row dtype and shape, bytes per row) — then the leaves' row
bytes. All entries of a node share the prefix, so a batch of hits is checked by comparing
prefixes and assembled with one join (``Layout.build``). Two forms of prefix are read:

* ``SMZ2``, a 2-byte length, the layout as compact JSON: what is written. A row of a
  10-class output (40 bytes) carries about 55 bytes of it;
* ``SMZR``, a 4-byte length, the layout as canonical data (``values.encode``): what
  somatize wrote before (about 156 bytes a row), and what it still writes for a layout
  JSON cannot say.

Either is parsed with a data parser, never unpickled. The form is not part of a row's key:
entries of both forms answer the same keys, and an ``SMZR`` entry met beside ``SMZ2``
ones is computed again and so rewritten as ``SMZ2`` (``remember``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from .row_batches import Leaf, RowCodec
from .values import decode, encode

__all__ = ["ROWS_VERSION", "Layout", "check_entry", "encode_rows", "is_current", "layout_of"]

ROWS_VERSION = "somatize.rows/1"
_MAGIC = b"SMZ2"  # the layout as JSON, its length in 2 bytes
_OLD = b"SMZR"  # the layout as canonical data (with ROWS_VERSION), its length in 4 bytes
_SHORT, _LEN = struct.Struct(">H"), struct.Struct(">I")

# Entry prefixes by (kind, field names, leaf layouts), made once.
_prefixes: dict[tuple[Any, ...], bytes] = {}
# Parsed layouts by (entry prefix, codec tags): a node's entries share one, parsed once.
_layouts: dict[tuple[bytes, tuple[str, ...]], Layout] = {}


def _prefix(kind: str, names: tuple[Any, ...], infos: tuple[Any, ...]) -> bytes:
    try:
        text = json.dumps(
            [kind, list(names), [list(i) for i in infos]], separators=(",", ":"), allow_nan=False
        ).encode()
    except (TypeError, ValueError):  # a codec's layout JSON cannot say: canonical data
        text = b""
    if (
        text
        and len(text) < 1 << 16
        and _parse(_MAGIC + _SHORT.pack(len(text)) + text)
        == (
            kind,
            names,
            infos,
        )
    ):
        return _MAGIC + _SHORT.pack(len(text)) + text
    layout = encode((ROWS_VERSION, kind, names, list(infos)))
    return _OLD + _LEN.pack(len(layout)) + layout


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _parse(prefix: bytes) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    """(kind, field names, leaf infos) of a prefix, lists read back as tuples (as codecs
    give layouts)."""
    if prefix[:4] == _MAGIC:
        kind, names, infos = json.loads(prefix[6:])
        return kind, tuple(names), tuple(_tuples(i) for i in infos)
    version, kind, names, infos = decode(prefix[8:])
    if version != ROWS_VERSION:
        raise ValueError(f"entry written by {version!r}")
    return kind, tuple(names), tuple(infos)


def encode_rows(kind: str, names: tuple[Any, ...], leaves: list[Leaf], n: int) -> list[bytes]:
    """One entry per row of an output batch."""
    blobs = [rows.rows(v) for _, rows, v in leaves]
    infos = tuple((tag, rows.layout(v), nb) for (tag, rows, v), (_, nb) in zip(leaves, blobs))
    memo: tuple[Any, ...] | None = (kind, names, infos)
    try:
        prefix = _prefixes.get(memo)  # type: ignore[arg-type]
    except TypeError:  # a codec's layout that does not hash: made every time
        prefix, memo = None, None
    if prefix is None:  # a node's batches share one layout: made once
        prefix = _prefix(kind, names, infos)
        if memo is not None:
            if len(_prefixes) > 256:
                _prefixes.clear()
            _prefixes[memo] = prefix
    if len(blobs) == 1:
        mv, nb = blobs[0]
        return [prefix + mv[i : i + nb] for i in range(0, n * nb, nb)] if nb else [prefix] * n
    return [b"".join([prefix, *(mv[i * nb : (i + 1) * nb] for mv, nb in blobs)]) for i in range(n)]


class Layout:
    """The parsed layout of a node's entries: structure, and where each leaf's bytes lie."""

    def __init__(self, prefix: bytes, codecs: Sequence[Any]) -> None:
        self.prefix = prefix
        self.head = itemgetter(slice(len(prefix)))  # an entry's prefix
        self.current = prefix[:4] == _MAGIC  # (the form written now)
        self.kind, self.names, infos = _parse(prefix)
        by_tag = {c.tag: getattr(c, "rows", None) for c in codecs}
        self.leaves: list[tuple[RowCodec, Any, int, int]] = []
        start = len(prefix)
        for tag, layout, nb in infos:
            rows = by_tag.get(tag)
            if rows is None:
                raise ValueError(f"entry needs codec {tag!r}, which was not passed")
            if not (type(nb) is int and nb >= 0):
                raise ValueError(f"a leaf of {nb!r} bytes per row")
            self.leaves.append((rows, layout, start, nb))
            start += nb
        self.size = start

    def build(self, entries: list[bytes], device: str | None) -> list[Any]:
        out = []
        for rows, layout, start, nb in self.leaves:
            end = start + nb
            # memoryview slices: the row bytes are copied once, into the joined buffer (a
            # join of the whole entries, then a strided copy out of it, measured slower in
            # a warm epoch, 40 against 30 µs a batch of 64 rows, though faster in a loop)
            raw = bytearray().join([memoryview(e)[start:end] for e in entries])
            out.append(rows.build(layout, raw, len(entries), device))
        return out


def is_current(entry: bytes) -> bool:
    """Whether ``entry`` has the prefix form written now (``SMZ2``)."""
    return entry[:4] == _MAGIC


def layout_of(entry: bytes, codecs: Sequence[Any]) -> Layout:
    """The parsed layout of ``entry``; ``ValueError`` if it is not a per-example entry."""
    head = entry[:4]
    if head == _MAGIC and len(entry) >= 6:
        end = 6 + _SHORT.unpack_from(entry, 4)[0]
    elif head == _OLD and len(entry) >= 8:
        end = 8 + _LEN.unpack_from(entry, 4)[0]
    else:
        raise ValueError("not a per-example entry")
    if end > len(entry):
        raise ValueError("a per-example entry shorter than its layout")
    memo = (entry[:end], tuple(c.tag for c in codecs))
    layout = _layouts.get(memo)
    if layout is None:
        if len(_layouts) > 256:
            _layouts.clear()
        layout = _layouts[memo] = Layout(memo[0], codecs)
    return layout


def check_entry(entry: bytes, codecs: Sequence[Any]) -> bool:
    """Whether ``entry`` is a per-example row (False: some other kind of entry); raises
    ``ValueError`` when it is one that does not parse or whose length its layout does not
    give (``somatize cache verify``). A row needing a codec not in ``codecs`` raises the
    ``"which was not passed"`` error a data value would."""
    if entry[:4] not in (_MAGIC, _OLD):
        return False
    layout = layout_of(entry, codecs)
    if len(entry) != layout.size:
        raise ValueError(
            f"a per-example row of {len(entry)} bytes where its layout gives {layout.size}"
        )
    return True
