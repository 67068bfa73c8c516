"""What a node *is* (identity), how it was *made* (declaration) and what it *holds* (state).

These are three of the four parts of a node's key (the fourth: its predecessors' keys).

* identity — the qualified class name plus a fingerprint of its code: the AST with
  docstrings and comments removed, *and* the code of every helper function or class
  from the user's own modules it references, transitively (site-packages and the
  standard library enter by name; the somatize and torch versions enter too).
* declaration — the constructor arguments, bound to parameter names with defaults
  applied, canonicalised the first time a key is needed.
* state — what the node holds that changes its output: plain-data attributes, and
  objects a codec fingerprints (module weights, tensors).
"""

from __future__ import annotations

import ast
import contextlib
import dis
import functools
import importlib.metadata
import inspect
import linecache
import os
import symtable
import sys
import sysconfig
import textwrap
import types
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from .errors import DeclarationError
from .node import Node
from .values import digest, is_data

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["declaration", "fingerprint", "identity"]

# The code of each class or function, read once: (digest of it, dotted names it reads).
# Only an object's own code is kept here: what its names resolve to is looked up on
# every fingerprint, since a helper module may be reloaded under an unchanged class.
_sources: weakref.WeakKeyDictionary[Any, tuple[bytes, list[list[str]]]] = (
    weakref.WeakKeyDictionary()
)


@functools.cache
def _versions() -> str:
    parts = []
    for dist in ("somatize", "torch"):
        try:
            parts.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist}=none")
    return " ".join(parts)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    roots.add(os.path.dirname(os.path.abspath(__file__)))  # somatize itself: enters by version
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def _is_user_module(module: types.ModuleType | None) -> bool:
    if module is None:
        return False
    file = getattr(module, "__file__", None)
    if file is None:
        return module.__name__ == "__main__"
    return not os.path.realpath(file).startswith(_library_roots())


def _strip_docstrings(tree: ast.AST) -> None:
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


def _source_tree(obj: Any) -> ast.AST | None:
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
    for f in _functions(cls):
        code = f.__code__
        if code.co_filename == file and not first <= code.co_firstlineno < end:
            return False
    return True


def _code_digest(code: types.CodeType, h: Any) -> None:
    """Fallback when no source is available: the bytecode, constants and names."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_freevars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        elif isinstance(const, frozenset):  # `x in {"a", "b"}`: its repr follows hash order
            h.update(repr(sorted(map(repr, const))).encode())
        else:
            h.update(repr(const).encode())


_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"})


def _code_names(code: types.CodeType) -> list[list[str]]:
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
            names += _code_names(const)
    return names


def _functions(obj: Any) -> list[types.FunctionType]:
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


def _referenced(tree: ast.AST) -> list[list[str]]:
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


def _describe(obj: Any, memo: dict[int, str], codecs: Sequence[Codec] = ()) -> str:
    """How a referenced global enters a fingerprint: user code by its fingerprint, library
    code by name, data by content (with ``codecs``, tensors and arrays too), anything else
    by its type."""
    if isinstance(obj, (types.FunctionType, type)) and _is_user_module(
        sys.modules.get(obj.__module__)
    ):
        return "code:" + _fingerprint(obj, memo, codecs)
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)):
        name = getattr(obj, "__qualname__", None) or obj.__name__
        return f"lib:{getattr(obj, '__module__', '') or ''}.{name}"
    if is_data(obj):
        return "data:" + digest(obj)
    if codecs and is_data(obj, codecs):  # a global tensor or array (normalising constants)
        return "data:" + digest(obj, codecs)
    return "obj:" + type(obj).__qualname__


def _own(obj: Any) -> tuple[bytes, list[list[str]]]:
    """The digest of ``obj``'s own code and the dotted names it reads (read once per object)."""
    cached = _sources.get(obj)
    if cached is not None:
        return cached
    h = blake3()
    h.update(f"{obj.__module__}.{obj.__qualname__}\0".encode())
    # The source of a lambda is the whole statement around it, shared by every lambda in
    # it (`Apply(lambda x: x + 1) | Apply(lambda x: x * 2)`): a lambda is known by its code.
    is_lambda = getattr(obj, "__name__", None) == "<lambda>"
    tree = None if is_lambda else _source_tree(obj)
    if tree is None:
        names: list[list[str]] = []
        for f in _functions(obj):
            _code_digest(f.__code__, h)
            names += _code_names(f.__code__)
    else:
        _strip_docstrings(tree)
        h.update(ast.dump(tree, annotate_fields=False, include_attributes=False).encode())
        names = _referenced(tree)
    result = (h.digest(), names)
    with contextlib.suppress(TypeError):  # objects that take no weak reference
        _sources[obj] = result
    return result


def _fingerprint(obj: Any, memo: dict[int, str], codecs: Sequence[Codec] = ()) -> str:
    """``obj``'s code and, transitively, the user code it references.

    ``memo`` holds what one top-level call has computed, so the result depends only on
    the object fingerprinted, never on what was fingerprinted before it.
    """
    done_or_running = memo.get(id(obj))
    if done_or_running is not None:
        return done_or_running
    memo[id(obj)] = "cycle:" + str(obj.__qualname__)  # recursion between helpers
    h = blake3(_own(obj)[0])
    for dotted, target in _references(obj):
        h.update(f"{dotted}={_describe(target, memo, codecs)}\0".encode())
    result = h.hexdigest()
    memo[id(obj)] = result
    return result


def _references(obj: Any) -> list[tuple[str, Any]]:
    """(dotted name, object) of every global or closure name ``obj``'s code reads."""
    names = _own(obj)[1]
    module = sys.modules.get(obj.__module__)
    scope = dict(vars(module)) if module else {}
    if isinstance(obj, types.FunctionType):
        scope.update(obj.__globals__)
    # Closures: `def make(k): class Mul(Node): ... x * k` makes classes that differ by `k`
    # alone; a closure variable shadows a global of the same name.
    for f in _functions(obj):
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or (), strict=True):
            with contextlib.suppress(ValueError):  # an empty cell: not assigned yet
                scope[name] = cell.cell_contents
    done = set()
    found = []
    for chain in names:
        if chain[0] not in scope or chain[0] in ("self", "cls"):
            continue
        target = scope[chain[0]]
        used = [chain[0]]
        for attr in chain[1:]:  # follow module attributes: mod.helper, pkg.mod.helper
            if not isinstance(target, types.ModuleType) or not hasattr(target, attr):
                break
            target = getattr(target, attr)
            used.append(attr)
        dotted = ".".join(used)
        if dotted in done or target is obj:
            continue
        done.add(dotted)
        found.append((dotted, target))
    return found


def fingerprint(obj: type | types.FunctionType, codecs: Sequence[Codec] = ()) -> str:
    """A digest of a class's or function's code and of the user helpers it references
    (and of the data they read as globals: with ``codecs``, tensors and arrays too)."""
    return _fingerprint(obj, {}, codecs)


def identity(impl: Any, codecs: Sequence[Codec] = ()) -> str:
    """The identity part of a node's key: qualified class name, code fingerprint, versions.

    Example:
        >>> from somatize import Node
        >>> class A(Node): pass
        >>> identity(A()) == identity(A())
        True
    """
    cls = type(impl)
    return f"{cls.__module__}.{cls.__qualname__}:{fingerprint(cls, codecs)}:{_versions()}"


def _declare(value: Any, where: str, codecs: Sequence[Codec]) -> Any:
    t = type(value)
    if t is list or t is tuple:
        return t(_declare(v, f"{where}[{i}]", codecs) for i, v in enumerate(value))
    if t is dict:
        for k in value:
            if type(k) is not str and type(k) is not int:
                raise DeclarationError(
                    f"argument {where} has a dict key {k!r} of type {type(k).__qualname__}, "
                    "which cannot be written into a key; use str or int keys, "
                    "or do not cache this node"
                )
        return {k: _declare(v, f"{where}[{k!r}]", codecs) for k, v in value.items()}
    if is_data(value, codecs):
        return value
    if isinstance(value, Node):
        return {"node": identity(value), "args": declaration(value, codecs)}
    if isinstance(value, (types.FunctionType, type)):
        return {"code": _describe(value, {})}
    if isinstance(value, (types.BuiltinFunctionType, types.ModuleType)):
        return {"lib": _describe(value, {})}
    for codec in codecs:
        fp = codec.fingerprint(value)
        if fp is not None:
            return {"state": fp}
    raise DeclarationError(
        f"argument {where} is a {type(value).__qualname__}, which cannot be written into a key; "
        "pass plain data (numbers, str, lists, dicts), a Node, a function or a tensor instead, "
        "or do not cache this node"
    )


def declaration(impl: Any, codecs: Sequence[Codec] = ()) -> str:
    """The declaration part of a node's key: its bound constructor arguments, as a digest.

    Computed once per node, the first time a key is needed.

    Raises:
        DeclarationError: an argument is neither data nor something with a fingerprint.
    """
    cached = impl.__dict__.get("_somatize_decl")
    if cached is not None:
        return str(cached)
    args, kwargs = impl.__dict__.get("_somatize_args", ((), {}))
    cls = type(impl)
    if cls.__init__ is object.__init__:
        bound: dict[str, Any] = {}
    else:
        sig = inspect.signature(cls.__init__)
        ba = sig.bind(impl, *args, **kwargs)
        ba.apply_defaults()
        bound = dict(list(ba.arguments.items())[1:])
    declared = {k: _declare(v, f"{k!r} of {cls.__qualname__}", codecs) for k, v in bound.items()}
    result = digest(declared, codecs, where=f"the arguments of {cls.__qualname__}")
    impl.__dict__["_somatize_decl"] = result
    return result
