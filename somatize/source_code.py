"""Reading a class's or function's own code: its source tree without docstrings (or, with
no source, its bytecode), the dotted global names it reads, and whether the source as it
is now compiles to the code that was loaded (``same_as_loaded``). ``somatize/own_code.py``
and ``somatize/identity.py`` build fingerprints out of these."""

from __future__ import annotations
import __future__

import ast
import dis
import functools
import inspect
import linecache
import operator
import os
import symtable
import textwrap
import types
from typing import Any

__all__ = [
    "code_digest",
    "code_names",
    "functions",
    "referenced",
    "same_as_loaded",
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


def source_tree(obj: Any) -> tuple[ast.AST, str, int, int] | None:
    """The source of ``obj`` as the file is now, parsed, with the file and the lines it
    spans (first, end); None where there is none. Whether those lines are the code that
    runs is ``same_as_loaded``'s to say."""
    try:
        file = inspect.getsourcefile(obj)
        entry = linecache.cache.get(file or "")
        if file and entry is not None and len(entry) == 4 and entry[1] is not None:
            # A file read from disk (not a notebook cell, which has no mtime): read it again,
            # since an edit of the same size within one mtime tick escapes checkcache().
            del linecache.cache[file]
        lines, start = inspect.getsourcelines(obj)
        if file is None:
            return None
        return ast.parse(textwrap.dedent("".join(lines))), file, start, start + len(lines)
    except (OSError, TypeError, SyntaxError):
        return None


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
_GLOBAL = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})


def code_names(code: types.CodeType, free: frozenset[str] | None = None) -> list[list[str]]:
    """Dotted chains of the global and closure names a code object (and code nested in it)
    reads: ``helper``, ``mod.helper``. Locals, parameters and attribute names are not, nor
    a local that nested code shares (``x`` in ``[x * i for i in r]``: a cell, not a
    closure from outside: only ``free``, the outermost code's free names, are)."""
    if free is None:
        free = frozenset(code.co_freevars)
    names: list[list[str]] = []
    chain: list[str] | None = None
    for ins in dis.get_instructions(code):
        if ins.opname in _LOADS and (ins.opname in _GLOBAL or ins.argval in free):
            chain = [str(ins.argval)]
            names.append(chain)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain is not None:
            chain.append(str(ins.argval))
        elif ins.opname not in ("CACHE", "PRECALL", "EXTENDED_ARG"):
            chain = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += code_names(const, free)
    return names


def functions(obj: Any) -> list[types.FunctionType]:
    """A function itself, or the functions defined in a class's body."""
    if isinstance(obj, types.FunctionType):
        return [obj]
    found = []
    for member in vars(obj).values():
        found += held(member)
    return found


def held(member: Any) -> list[types.FunctionType]:
    """The functions a class attribute holds: itself, a classmethod's or staticmethod's
    function, a property's getter."""
    return [
        f
        for f in (getattr(member, "__func__", member), getattr(member, "fget", None))
        if isinstance(f, types.FunctionType)
    ]


def unwrapped(f: types.FunctionType) -> list[types.FunctionType]:
    """``f`` and the functions it wraps (``functools.wraps``' ``__wrapped__``, as
    ``torch.no_grad()`` and most decorators set it), outermost first."""
    chain = [f]
    inner = getattr(f, "__wrapped__", None)
    while isinstance(inner, types.FunctionType) and inner not in chain and len(chain) < 8:
        chain.append(inner)
        inner = getattr(inner, "__wrapped__", None)
    return chain


# (file, __future__ flags) -> (the text compiled, its code objects by qualified name)
_COMPILED: dict[tuple[str, int], tuple[str, dict[str, list[types.CodeType]] | None]] = {}


def same_as_loaded(obj: Any, file: str, first: int = 0, end: int = 0) -> bool:
    """Whether every function of ``obj`` (itself, or those of a class's body, and what
    they wrap) compiled from ``file`` is what the text linecache now holds for ``file``
    compiles to, under its qualified name, and (with ``end``) from lines ``first`` to
    ``end``, the source read: that source is the code that runs. False where the file was
    edited since it was imported (or no longer compiles), or where the lines read are
    another definition's (a class defined twice under one name: 3.11's ``inspect`` finds
    the first). Bytecode, names and constants are compared (nested code too), not line
    numbers: an edit of comments, or elsewhere in the file, leaves the code the same."""
    where, name = _real(file), obj.__qualname__
    for outer in functions(obj):
        for f in unwrapped(outer):
            code = f.__code__
            if _real(code.co_filename) != where:
                continue  # (a library's decorator, generated code: not this file's)
            codes = _compiled(file, code.co_flags & _FUTURE)
            if codes is None:
                return False
            qualname = getattr(code, "co_qualname", f.__qualname__)  # (3.11+: the code's own)
            # What ``obj`` defines is in the lines read: a function named as defined in it
            # (its code replaced in place keeps the name), or whose code is. A function put
            # in a class, or a decorator's wrapper (named as what it wraps), is anywhere.
            named = qualname if hasattr(f, "__wrapped__") else f.__qualname__
            ours = end and any(q == name or q.startswith(name + ".") for q in (qualname, named))
            if not any(
                same_code(code, c) and (not ours or first <= c.co_firstlineno < end)
                for c in codes.get(qualname, ())
            ):
                return False
    return True


@functools.lru_cache(maxsize=4096)
def _real(file: str) -> str:
    return os.path.realpath(file)


# the compiler flags of ``from __future__`` imports: a code object's own, which its source
# compiles to under the same (an ``exec`` or ``compile`` may pass its caller's)
_FUTURE = functools.reduce(
    operator.or_, (getattr(__future__, n).compiler_flag for n in __future__.all_feature_names)
)


def _compiled(file: str, flags: int) -> dict[str, list[types.CodeType]] | None:
    """The code objects of ``file``'s text as linecache holds it now, compiled with the
    ``__future__`` ``flags``, by qualified name (None where it does not compile); compiled
    once per text and flags."""
    text = "".join(linecache.getlines(file))
    kept = _COMPILED.get((file, flags))
    if kept is not None and kept[0] == text:
        return kept[1]
    codes: dict[str, list[types.CodeType]] | None
    try:
        top = compile(text, file, "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        codes = None
    else:
        codes = {}
        _collect(top, "", codes)  # (qualified name -> code objects)
    if len(_COMPILED) > 256:
        _COMPILED.clear()
    _COMPILED[file, flags] = (text, codes)
    return codes


def _collect(code: types.CodeType, prefix: str, out: dict[str, list[types.CodeType]]) -> None:
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            name = getattr(c, "co_qualname", prefix + c.co_name)
            out.setdefault(name, []).append(c)
            # (3.10: a function's inner names are `f.<locals>.g`, a class body's `C.g`)
            _collect(c, name + (".<locals>." if c.co_flags & inspect.CO_NEWLOCALS else "."), out)


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Whether two code objects do the same: bytecode, signature, names and constants
    (code among them compared so too); line numbers and file names aside."""
    if (
        a.co_code != b.co_code
        or a.co_names != b.co_names
        or a.co_varnames != b.co_varnames
        or a.co_freevars != b.co_freevars
        or a.co_cellvars != b.co_cellvars
        or a.co_flags != b.co_flags
        or a.co_argcount != b.co_argcount
        or a.co_posonlyargcount != b.co_posonlyargcount
        or a.co_kwonlyargcount != b.co_kwonlyargcount
        or len(a.co_consts) != len(b.co_consts)
    ):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType):
            if not isinstance(y, types.CodeType) or not same_code(x, y):
                return False
        elif type(x) is not type(y) or (x != y if type(x) is frozenset else repr(x) != repr(y)):
            return False  # (repr: tells -0.0 from 0.0, and a NaN equals itself)
    return True


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
