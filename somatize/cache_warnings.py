"""What a cached node does that its key cannot see, said once per node: reading what ``ctx``
carries (``warn_ctx_reads``), changing its own state while it runs
(``warn_changed_itself``), writing into its input in place (``wrote_input``, per-example
rows, seen as it runs; ``warn_writes_input``, a node cached whole, read from its source
when ``g.cache`` marks it). Used by the keyed walk (``keyed.py``), per-example rows
(``rows.py``) and ``g.cache`` (``graph_settings.py``)."""

from __future__ import annotations

import ast
import dis
import types
import warnings
import weakref
from typing import Any

from .node import Mapped, Node
from .source_code import source_tree
from .stack import outside

__all__ = [
    "ctx_reads",
    "input_writes",
    "warn_changed_itself",
    "warn_ctx_reads",
    "warn_writes_input",
    "wrote_input",
]

# What a node may read of ctx that does not enter any key (``ctx.node``, ``ctx.device`` do
# not change its output's content).
_UNKEYED = frozenset({"get", "values", "run", "run_id", "step", "training"})
# weakly: a class made per run (a factory's `class Enc(Node)` in a sweep) goes when it is dropped
_ctx_reads: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()
_said: set[tuple[Any, ...]] = set()  # (what, node id, class) warned about
# Methods that change a list or dict in place (a set does not cross an edge); tensors have
# none of them. sort and reverse count only as a statement: a tensor's return their result.
_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem"}
)
_STATEMENT_MUTATORS = frozenset({"sort", "reverse"})


def ctx_reads(cls: type) -> frozenset[str]:
    """What ``cls.forward`` reads of its ctx that enters no key (``{"get", "step"}``), from
    its bytecode (comprehensions and lambdas inside it included); read once per class."""
    known = _ctx_reads.get(cls)
    if known is not None:
        return known
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    found: set[str] = set()
    if code is not None and code.co_argcount >= 3:
        name = code.co_varnames[2]  # forward(self, x, ctx)
        todo = [code]
        while todo:
            c = todo.pop()
            prev: Any = None
            for ins in dis.get_instructions(c):
                if (
                    ins.opname in ("LOAD_ATTR", "LOAD_METHOD")
                    and ins.argval in _UNKEYED
                    and prev is not None
                    and prev.opname.startswith(("LOAD_FAST", "LOAD_DEREF"))
                    and name in (prev.argval if type(prev.argval) is tuple else (prev.argval,))
                ):
                    found.add(ins.argval)
                prev = ins
            todo += [k for k in c.co_consts if type(k) is types.CodeType and name in k.co_freevars]
    _ctx_reads[cls] = result = frozenset(found)
    return result


def warn_ctx_reads(label: str, impl: Any, training: bool) -> None:
    """Warn once per node that a node whose key is needed reads what ctx carries, which no
    key holds: a cached output computed under one value would be served under another.
    ``ctx.training`` counts only where it is True (a frozen node's, or an eval run's, is not)."""
    cls = type(impl.inner if isinstance(impl, Mapped) else impl)
    reads = ctx_reads(cls)
    if not reads:  # (most nodes: no set made)
        return
    if not training:
        reads = reads - {"training"}
    if not reads or ("ctx", label, cls) in _said:
        return
    which = ", ".join(f"ctx.{r}" for r in sorted(reads))
    _once(
        ("ctx", label, cls),
        f"node {label!r} ({cls.__qualname__}) is cached or feeds a cached node, and its "
        f"forward reads {which}: what ctx carries (injected values, the step, the training "
        "flag) enters no key, so an output computed under one value would be served under "
        "another. Pass such a value as a constructor argument or in the graph input, or "
        "stop caching it",
    )


def warn_changed_itself(label: str, impl: Any) -> None:
    """Say once per node that a remembered node (cached whole or per example) changed its
    own state while it ran."""
    cls = type(impl.inner if isinstance(impl, Mapped) else impl).__qualname__
    _once(
        ("changed", label, cls),
        f"node {label!r} ({cls}) is cached but changed its own state while it ran (an "
        "attribute assigned or mutated in forward): its key includes its state, so the entry "
        "just stored is keyed by the state it had before the call, and a node that changes "
        "itself on every call (a counter) never hits. Set such attributes up in __init__, "
        "report counts with Done(value, metrics=...) instead, or stop caching the node",
    )


def wrote_input(label: str, impl: Any) -> None:
    """Say once per node that a node cached per example wrote into its input in place."""
    cls = type(impl).__qualname__
    _once(
        ("wrote", label, cls),
        f"node {label!r} ({cls}) is cached per example but wrote into its input in place "
        "(x.div_(255), a transform with inplace=True): its rows were keyed before the write, "
        "and on a hit it does not run, so whatever else reads that input (another node, "
        "your loop) sees it written on a miss and unwritten on a hit. Compute out of place "
        "(x = x / 255), or clone the input first (x = x.clone())",
    )


def input_writes(cls: type) -> str:
    """How ``cls.forward`` writes into its input in place, read from its source: the first
    such write as written (``words.pop(...)``, ``x[...] = ...``, ``x.mul_(...)``), or "" —
    also where the source cannot be read or the input is bound anew first (a copy). Read
    once per forward (a sweep's graphs each mark the node cached)."""
    fn = getattr(cls, "forward", None)
    code = getattr(fn, "__code__", None)
    if code is None or code.co_argcount < 2:
        return ""
    known = _writes.get(code)
    if known is None:
        found = source_tree(fn)
        known = "" if found is None else first_write(found[0], code.co_varnames[1])
        if len(_writes) > 1024:
            _writes.clear()
        _writes[code] = known
    return known


_writes: dict[types.CodeType, str] = {}  # a forward's code -> how it writes its input


def first_write(tree: ast.AST, name: str) -> str:
    """The first in-place write into ``name`` in ``tree``, as written; "" where there is
    none, or where ``name`` is bound anew (``words = list(words)``)."""
    nodes = sorted(
        (n for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))),
        key=lambda n: (n.lineno, n.col_offset),
    )
    if any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in nodes
    ):
        return ""  # words = list(words): whatever it writes then is its own
    statements = {
        id(n.value.func)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
    }
    for n in nodes:
        if isinstance(n, ast.Name):
            continue
        base = n.value
        while isinstance(base, ast.Subscript):
            base = base.value
        if not (isinstance(base, ast.Name) and base.id == name):
            continue
        if isinstance(n.ctx, (ast.Store, ast.Del)):  # x[k] = v, del x[k], x.attr = v
            what = f"{name}[...]" if isinstance(n, ast.Subscript) else f"{name}.{n.attr}"
            return f"del {what}" if isinstance(n.ctx, ast.Del) else f"{what} = ..."
        if isinstance(n, ast.Attribute) and (
            n.attr in _MUTATORS
            or (n.attr in _STATEMENT_MUTATORS and id(n) in statements)
            or (n.attr.endswith("_") and not n.attr.startswith("_"))
        ):  # words.append(w), words.sort(); x.mul_(2), torch's in-place methods
            return f"{name}.{n.attr}(...)"
    return ""


def warn_writes_input(label: str, impl: Any) -> None:
    """Say once per node that a node being cached whole writes into its input in place: on a
    hit it does not run, so what else reads that input sees it written or not by chance."""
    inner = impl.inner if isinstance(impl, Mapped) else impl
    if not isinstance(inner, Node):  # (a subgraph: its own nodes are not cached by this)
        return
    how = input_writes(type(inner))
    if how:
        cls = type(inner).__qualname__
        _once(
            ("writes", label, cls),
            f"node {label!r} ({cls}) is cached but its forward writes into its input in place "
            f"({how}): on a hit it does not run, so whatever else reads that input (a node "
            "beside it, the caller's own list) sees it written after a miss and unwritten "
            "after a hit. Compute out of place (words = [*words, w], x = x * 2), or copy the "
            "input first (words = list(words))",
        )


def _once(key: tuple[Any, ...], message: str) -> None:
    """Warn ``message`` once per process for ``key`` (what, node id, class), at the user's line."""
    if key in _said:
        return
    _said.add(key)
    warnings.warn(message, UserWarning, stacklevel=outside())
