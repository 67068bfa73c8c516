"""Reading a class's or function's own code: its source tree without docstrings (or, with
no source, its bytecode), and the dotted global names it reads. ``somatize/identity.py``
builds fingerprints out of these."""

from __future__ import annotations

import ast
import dis
import inspect
import linecache
import symtable
import textwrap
import types
from typing import Any

__all__ = [
    "code_digest",
    "code_names",
    "functions",
    "referenced",
    "source_tree",
    "strip_docstrings",
]


def strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]


def source_tree(obj: Any) -> ast.AST | None:
    try:
        file = inspect.getsourcefile(obj)
        entry = linecache.cache.get(file or "")
        if file and entry is not None and len(entry) == 4 and entry[1] is not None:
            # A file read from disk (not a notebook cell, which has no mtime): read it again,
            # since an edit of the same size within one mtime tick escapes checkcache().
            del linecache.cache[file]
        lines, start = inspect.getsourcelines(obj)
        if isinstance(obj, type) and not _spans(obj, file, start, start + len(lines)):
            return None  # another class of the same name (3.11 finds the first): by bytecode
        return ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None


def _spans(cls: type, file: str | None, first: int, end: int) -> bool:
    """Whether the source lines ``first``..``end`` hold the methods of ``cls`` defined in
    ``file``: the source found is that class's, not an earlier one's of the same name."""
    for f in functions(cls):
        code = f.__code__
        if code.co_filename == file and not first <= code.co_firstlineno < end:
            return False
    return True


def code_digest(code: types.CodeType, h: Any) -> None:
    """Fallback when no source is available: the bytecode, constants and names."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_freevars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            code_digest(const, h)
        elif isinstance(const, frozenset):  # `x in {"a", "b"}`: its repr follows hash order
            h.update(repr(sorted(map(repr, const))).encode())
        else:
            h.update(repr(const).encode())


_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"})


def code_names(code: types.CodeType) -> list[list[str]]:
    """Dotted chains of the global and closure names a code object (and code nested in it)
    reads: ``helper``, ``mod.helper``. Locals, parameters and attribute names are not."""
    names: list[list[str]] = []
    chain: list[str] | None = None
    for ins in dis.get_instructions(code):
        if ins.opname in _LOADS:
            chain = [str(ins.argval)]
            names.append(chain)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain is not None:
            chain.append(str(ins.argval))
        elif ins.opname not in ("CACHE", "PRECALL", "EXTENDED_ARG"):
            chain = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += code_names(const)
    return names


def functions(obj: Any) -> list[types.FunctionType]:
    """A function itself, or the functions defined in a class's body."""
    if isinstance(obj, types.FunctionType):
        return [obj]
    found = []
    for member in vars(obj).values():
        for f in (getattr(member, "__func__", member), getattr(member, "fget", None)):
            if isinstance(f, types.FunctionType):
                found.append(f)
    return found


def _outside_names(tree: ast.AST) -> set[str] | None:
    """The names the code reads from outside itself (globals, builtins, closure cells), not
    its parameters and locals; None if the code cannot be analysed on its own."""
    try:
        top = symtable.symtable(ast.unparse(tree), "<fingerprint>", "exec")
    except SyntaxError:  # e.g. `nonlocal x` bound in a function around the snippet
        return None
    names: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        names.update(s.get_name() for s in table.get_symbols() if s.is_global())
        tables.extend(table.get_children())
    return names


def referenced(tree: ast.AST) -> list[list[str]]:
    """Dotted name chains the code reads from outside itself: ``helper``, ``mod.helper``,
    ``pkg.mod.helper``. A local that happens to share a global's name is not one of them."""
    outside = _outside_names(tree)
    chains = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                chains.append([cur.id, *reversed(parts)])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            chains.append([node.id])
    return chains if outside is None else [c for c in chains if c[0] in outside]


# Methods that change a list, dict or set in place
_MUTATORS = frozenset(
    {
        "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
        "update", "setdefault", "popitem", "add", "discard", "difference_update",
        "intersection_update", "symmetric_difference_update", "__setitem__", "__delitem__",
    }
)  # fmt: skip


def written(tree: ast.AST) -> set[str]:
    """The dotted names the code changes in place: ``CALLS["n"] += 1``, ``SEEN.append(x)``,
    ``del CACHE[k]``, ``LOG["a"]["b"] = 1`` (``LOG``), ``stats.SEEN.add(x)``
    (``stats.SEEN``), ``STATS.calls += 1`` (``STATS.calls``), ``type(self).rows += n``
    (``type(self).rows``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target: ast.AST = node.value
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target = node  # an attribute set: ``STATS.calls += 1``, ``Enc.rows += n``
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
        ):
            target = node.func.value
        else:
            continue
        while isinstance(target, ast.Subscript):
            target = target.value
        chain: list[str] = []
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if (
            isinstance(target, ast.Call)
            and isinstance(target.func, ast.Name)
            and target.func.id == "type"
            and len(target.args) == 1
            and isinstance(target.args[0], ast.Name)
        ):  # ``type(self).rows += n``: the class's own attribute
            names.add(".".join([f"type({target.args[0].id})", *reversed(chain)]))
        elif isinstance(target, ast.Name):
            names.add(".".join([target.id, *reversed(chain)]))
    return names
