"""Write docs/api.md from the docstrings of the public names.

    python tools/gen_api.py          # rewrite docs/api.md
    python tools/gen_api.py --check  # exit 1 if docs/api.md is out of date (tests run this)

The reference lists every name in ``somatize.__all__``, ``somatize.torch.__all__``,
``somatize.transports``, ``somatize.torch.federated`` and ``somatize.torch.lightning``: its signature and its
docstring's summary, arguments and example. Under each class come its public methods and
properties (names not starting with ``_``, defined on the class or on a somatize base
class), each with its signature and docstring.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "api.md"
sys.path.insert(0, str(ROOT))  # this checkout's package (an editable install may be another's)
MODULES = [
    ("somatize", "The engine (no torch)"),
    ("somatize.transports", "Transports: plan slices on other hosts"),
    ("somatize.torch", "somatize.torch: modules, the Trainer, many runs"),
    ("somatize.torch.federated", "somatize.torch.federated: federated experiments"),
    ("somatize.torch.lightning", "somatize.torch.lightning (the `lightning` extra)"),
]


def signature(obj: object, name: str) -> str:
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return name
    return f"{name}{sig}"


def members(cls: type) -> list[tuple[str, str, object]]:
    """(kind, name, object) of the class's public methods and properties, in the order
    they are defined: the class's own first, then those of its somatize base classes.
    Data fields, named-tuple fields and descriptors that refuse (a torch.nn.Module method
    a Graph does not have) are left out."""
    found: list[tuple[str, str, object]] = []
    names: set[str] = set()
    for base in cls.__mro__:
        if not base.__module__.startswith("somatize"):
            continue
        for name, raw in vars(base).items():
            if name.startswith("_") or name in names:
                continue
            names.add(name)  # an override hides the base's, even when it is left out
            if isinstance(raw, (property, functools.cached_property)):
                found.append(("property", name, raw))
            elif isinstance(raw, classmethod):
                found.append(("classmethod", name, raw.__func__))
            elif isinstance(raw, staticmethod):
                found.append(("staticmethod", name, raw.__func__))
            elif inspect.isfunction(raw):
                found.append(("method", name, raw))
    return found


def member_lines(cls: type, cls_name: str) -> list[str]:
    lines = []
    for kind, name, obj in members(cls):
        shown = f"{cls_name}.{name}"
        if kind == "property":
            fget = getattr(obj, "fget", None) or getattr(obj, "func", None)
            doc = inspect.getdoc(obj) or (inspect.getdoc(fget) if fget else None)
            if fget is not None:
                returns = inspect.signature(fget).return_annotation
                if returns is not inspect.Signature.empty:
                    shown += f": {returns}"
        else:
            try:
                sig = inspect.signature(obj)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                pass
            else:
                params = list(sig.parameters.values())
                if kind != "staticmethod":
                    params = params[1:]  # self or cls
                shown += str(sig.replace(parameters=params))
            doc = inspect.getdoc(getattr(cls, name, obj))
        lines += [f"#### `{cls_name}.{name}`", "", f"*{kind}* `{shown}`", ""]
        if doc:
            lines += [doc, ""]
    return lines


def section(module_name: str, title: str, seen: dict[int, str]) -> list[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", [])
    lines = [f"## {title}", "", f"`import {module_name}`", ""]
    for name in names:
        obj = getattr(module, name)
        doc = inspect.getdoc(obj) or ""
        if not doc or (inspect.isclass(obj) and doc == inspect.getdoc(obj.__mro__[1])):
            doc = "(no docstring)"
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
        shown = signature(obj, name) if kind != "value" else name
        lines += [f"### `{module_name}.{name}`", "", f"*{kind}* `{shown}`", "", doc, ""]
        if kind == "class" and members(obj):
            if id(obj) in seen:  # the same class under another module: its methods once
                first = seen[id(obj)]
                anchor = re.sub(r"[^\w\- ]", "", first.lower())
                lines += [f"Methods and properties: as [`{first}`](#{anchor}).", ""]
            else:
                seen[id(obj)] = f"{module_name}.{name}"
                lines += member_lines(obj, name)
    return lines


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python tools/gen_api.py`; `make test` checks it is",
        "current. For the ideas behind the names, read [concepts](concepts.md).",
        "",
    ]
    seen: dict[int, str] = {}  # id of a class whose methods are listed -> where
    for module_name, title in MODULES:
        lines += section(module_name, title, seen)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print("docs/api.md is out of date: run python tools/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
