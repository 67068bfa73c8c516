"""Why a remembered node hit or missed: ``g.explain(x)``.

Whenever a cached node stores what it computed, the engine also leaves a small *record*
of that node's key parts beside the keeper — not an entry: a file under ``notes/`` of a
``DiskKeeper``'s directory, in this process for other keepers; one per node, replaced
when it changes: identity,
the digest of its own code and of each user helper it reaches, its declaration, its
state and its input. ``g.explain(x)`` runs the graph on ``x`` against a read-only view of
the keeper (nothing is written) and, for each remembered node that missed, compares the
parts it has now with the record: which of code (and which helper), declaration, state
(weights), context (torch: the autocast dtype) or input changed since the last entry.

Example:
    >>> from somatize import Graph, Node, Done
    >>> class Upper(Node):
    ...     def forward(self, text, ctx): return Done(text.upper())
    >>> g = Graph().node("up", Upper()).cache("up")
    >>> print(g.explain("hi"))
    up: miss — nothing stored under this node yet
    >>> _ = g.forward("hi"); print(g.explain("hi"))
    up: hit
    >>> print(g.explain("ho"))
    up: miss — input changed
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .changes import code_parts, global_parts
from .keepers.atomic import replace_with
from .keepers.packs import NotRegular, open_regular
from .node import Mapped, Run, graph_input
from .values import decode, digest, encode

if TYPE_CHECKING:
    from .graph import Graph
    from .keepers import Keeper
    from .memory import NodeKeys

__all__ = ["Explanation", "Why", "explain", "explain_run", "note"]

RECORD = "somatize.explain/2"  # /2: a record on disk starts with the checksum of the rest
_SUM = 16  # bytes of blake3 checksum before a record on disk
NOTE_BYTES = 1 << 20  # a note over this is no note (records are kilobytes): never read whole
# What this process last wrote, by keeper and node: a record is written when it changes.
_written: weakref.WeakKeyDictionary[Any, dict[str, tuple[str | None, ...]]] = (
    weakref.WeakKeyDictionary()
)
# A node class's code and globals as a record names them, by class and identity part: read
# again only when the identity changes (every miss writes a record; walking the code and
# its helpers each time cost a miss more than the rest of its bookkeeping). Weak on the
# class: a sweep making its node classes per run (a factory's `class Enc(Node)`) keeps none.
_described: weakref.WeakKeyDictionary[type, dict[str, tuple[dict[str, str], dict[str, str]]]] = (
    weakref.WeakKeyDictionary()
)


def _slot(label: str) -> str:
    """The file name of node ``label``'s record."""
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", label)[:120]
    return f"{safe}.{digest((RECORD, label))[:16]}"


def _code(impl: Any, parts: Any = code_parts) -> dict[str, str]:
    cls = type(impl.inner if isinstance(impl, Mapped) else impl)
    try:
        found: dict[str, str] = parts(cls)
    except Exception:  # code that cannot be read: identity alone then tells the change
        return {}
    return found


# Records of keepers that are not on disk, by keeper (and of keepers taking no weak ref).
_kept: weakref.WeakKeyDictionary[Any, dict[str, bytes]] = weakref.WeakKeyDictionary()


def _notes(keeper: Any) -> Path | dict[str, bytes]:
    path = getattr(keeper, "path", None)
    if isinstance(path, Path):
        return path / "notes"
    try:
        return _kept.setdefault(keeper, {})
    except TypeError:
        return {}


def _read(keeper: Any, label: str) -> dict[str, Any] | None:
    notes = _notes(keeper)
    try:
        if isinstance(notes, Path):
            raw = _small(str(notes / _slot(label)))
            if raw is None or blake3(raw[_SUM:]).digest(_SUM) != raw[:_SUM]:
                return None  # torn, cut, altered, no regular file or too large: it says nothing
            data: bytes | None = raw[_SUM:]
        else:
            data = notes.get(_slot(label))
        record = decode(data) if data is not None else None
    except (OSError, ValueError):  # absent, unreadable, a link, or no decoding: it says nothing
        return None
    return record if isinstance(record, dict) else None


def _small(path: str) -> bytes | None:
    """A note's bytes; None for a FIFO or a device (opened without blocking: none hangs
    ``g.explain``) or a file over ``NOTE_BYTES`` (never read whole).

    Raises:
        OSError: absent, unreadable, or a symbolic link (never opened through).
    """
    try:  # (no link: the notes are the store's own, like its lock files)
        fd, st = open_regular(path, follow=False)
    except NotRegular:
        return None
    try:
        data = os.read(fd, NOTE_BYTES + 1) if st.st_size <= NOTE_BYTES else b""
    finally:
        os.close(fd)
    return data if 0 < len(data) <= NOTE_BYTES else None  # (b"": empty, or over the bound)


def note(
    keeper: Keeper,
    label: str,
    impl: Any,
    parts: Sequence[str],
    input: str | None,
    context: list[Any] | None = None,
) -> None:
    """Record the key parts of what node ``label`` just stored (skipped when unchanged),
    and the codecs' context that entered its state (``NodeKeys.context``)."""
    stamp = (*parts[:3], input)  # (compared as strings: no hash per batch)
    try:
        seen = _written.setdefault(keeper, {})
    except TypeError:  # a keeper that takes no weak reference: write every time
        seen = {}
    if seen.get(label) == stamp:
        return
    cls = type(impl.inner if isinstance(impl, Mapped) else impl)
    by_identity = _described.get(cls)
    if by_identity is None:
        by_identity = _described[cls] = {}
    described = by_identity.get(parts[0])
    if described is None:
        if len(by_identity) > 64:  # (its code changed in place that often)
            by_identity.clear()
        described = by_identity[parts[0]] = (_code(impl), _code(impl, global_parts))
    record: dict[str, Any] = {
        "identity": parts[0],
        "declaration": parts[1],
        "state": parts[2],
        "context": context,  # (records before it lack it: their misses say "state")
        "input": input,
        "code": described[0],
        "globals": described[1],  # (records before it lack it)
    }
    notes = _notes(keeper)
    if isinstance(notes, Path):
        try:
            data = encode(record)
            # atomic, not fsynced: a diagnosis, checksummed, like the cache entries it
            # describes (a power loss leaves an old record, or none: a miss is then unexplained)
            replace_with(
                str(notes / _slot(label)), [blake3(data).digest(_SUM), data], durable=False
            )
        except OSError:  # a record is a diagnosis: never fail a run for it
            return
    else:
        notes[_slot(label)] = encode(record)
    seen[label] = stamp


@dataclass(frozen=True)
class Why:
    """One remembered node's lookup: hit or miss, and on a miss what changed.

    Attributes:
        node: the node's id.
        hit: whether everything was read from the keeper.
        rows: for a node cached per example, (rows hit, rows missed); for a cached
            mapped node, (items hit, items missed).
        unit: what ``rows`` counts, ``"examples"`` or ``"items"``.
        changed: on a miss, what differs from the last entry stored under this node.
    """

    node: str
    hit: bool
    rows: tuple[int, int] | None
    changed: tuple[str, ...]
    unit: str = "examples"  # what ``rows`` counts: a mapped node's are its items

    def __str__(self) -> str:
        counts = ""
        if self.rows is not None:
            counts = f" ({self.rows[0]} of {sum(self.rows)} {self.unit} hit)"
        if self.hit:
            return f"{self.node}: hit{counts}"
        return f"{self.node}: miss{counts} — {', '.join(self.changed)}"


class Explanation(tuple[Why, ...]):
    """What ``g.explain(x)`` found, one ``Why`` per remembered node, in plan order."""

    def __str__(self) -> str:
        return "\n".join(map(str, self)) or "no node is cached"

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, str):  # by node id
            for why in self:
                if why.node == i:
                    return why
            raise KeyError(f"node {i!r} was not looked up; looked up: {[w.node for w in self]}")
        return super().__getitem__(i)


def _context(context: list[Any] | None) -> str:
    """A context as read (torch's: ((device type, autocast dtype), ..., ("default dtype",
    dtype), ("float32 matmul", precision))): "autocast cpu torch.bfloat16, ..."."""
    if context is None:
        return "off"
    pairs = [p for c in context for p in (c if isinstance(c, tuple) else (c,))]
    said = [" ".join(map(str, p)) if isinstance(p, tuple) else str(p) for p in pairs]
    if said and not said[0].startswith(("default dtype", "float32 matmul")):
        said[0] = "autocast " + said[0]
    return ", ".join(said)


def _state(record: dict[str, Any], impl: Any, keys: NodeKeys | None) -> list[str]:
    """Why the state part differs: the weights, only the context (autocast), or both."""
    weights = ["state (weights or held data)"]
    if keys is None or "context" not in record or record["context"] == keys.context():
        return weights
    before = record["context"]
    context = [f"context ({_context(keys.context())}, was {_context(before)})"]
    inner = impl.inner if isinstance(impl, Mapped) else impl  # what keys its rows
    try:  # the state it has now, under the context it had then
        same = keys.under(before).parts(inner)[2] == record["state"]
    except Exception:  # a diagnosis: never fail for it
        return weights
    return context if same else weights + context


def _changed(
    record: dict[str, Any] | None,
    impl: Any,
    parts: Sequence[str],
    input: str | None,
    keys: NodeKeys | None = None,
) -> list[str]:
    if record is None:
        return ["nothing stored under this node yet"]
    out = []
    if record.get("identity") != parts[0]:
        before, now = record.get("code") or {}, _code(impl)
        helpers = sorted(n for n in before.keys() | now.keys() if before.get(n) != now.get(n))
        out += [f"code of {n}" for n in helpers]
        was, has = record.get("globals"), _code(impl, global_parts)
        if isinstance(was, dict):
            out += [
                f"global {n}" for n in sorted(was.keys() | has.keys()) if was.get(n) != has.get(n)
            ]
        if not out:
            out.append("identity (class, or somatize/torch version)")
    if record.get("declaration") != parts[1]:
        out.append("declaration (constructor arguments)")
    if record.get("state") != parts[2]:
        out += _state(record, impl, keys)
    if input is not None and record.get("input") != input:
        out.append("input changed")
    return out


def explain(keeper: Keeper | None, looked: list[Any], keys: NodeKeys | None = None) -> Explanation:
    """Turn the walk's lookups into an Explanation (reading each node's record); ``keys``
    (the graph's) tell a change of context from one of state."""
    out = []
    for label, impl, parts, input, found in looked:
        rows = found if isinstance(found, tuple) else None
        hit = (rows[1] == 0) if rows is not None else bool(found)
        unit = "items" if isinstance(impl, Mapped) else "examples"
        changed: list[str] = []
        if not hit:
            record = _read(keeper, label) if keeper is not None else None
            changed = _changed(record, impl, parts, None if rows is not None else input, keys)
            if not changed and rows is not None:
                changed = [
                    f"input: {rows[1]} {unit[:-1] if rows[1] == 1 else unit} not seen before"
                ]
            elif not changed:
                changed = [
                    "the entry was evicted or removed (code, declaration, state, input same)"
                ]
        out.append(Why(label, hit, rows, tuple(changed), unit))
    return Explanation(out)


def explain_run(
    g: Graph, inputs: Sequence[Any], step: int, values: Mapping[str, Any] | None
) -> Explanation:
    """``g.explain(*inputs)``: run ``g`` against a read-only view of its keeper, then explain."""
    program = g.program()
    x, opaque, injected = graph_input(tuple(inputs), values, g.codecs)  # (as Graph.run reads them)
    run = Run(g.run_id, step, False, injected)
    keyed = program.input_keyed and not opaque
    x_key = digest(x, g.codecs, "the graph input") if keyed else None
    looked: list[Any] = []
    if program.keyed:  # (a subgraph's own keeper is not read here either: said so)
        from .nested_keepers import warn_unused_keepers

        warn_unused_keepers(g, program, g.keeper)
    view = ReadOnly(g.keeper)
    program.run_keyed(x, opaque, x_key, run, g.keys, view, (), explained=looked)
    return explain(g.keeper, looked, g.keys)


class ReadOnly:
    """A view of a keeper that reads and never writes (``g.explain`` changes nothing)."""

    def __init__(self, keeper: Keeper | None) -> None:
        self.keeper = keeper

    def get(self, key: str) -> bytes | None:
        return self.keeper.get(key) if self.keeper is not None else None

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        from .rows import get_many

        return get_many(self.keeper, keys)

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        pass

    def put_many(self, items: Sequence[tuple[str, bytes]], *, pinned: bool = False) -> None:
        pass

    def name(self, name: str, key: str) -> None:
        pass

    def lookup(self, name: str) -> bytes | None:
        return self.keeper.lookup(name) if self.keeper is not None else None
