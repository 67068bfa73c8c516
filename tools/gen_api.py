"""Write docs/api.md from the docstrings of the public names.

    python tools/gen_api.py          # rewrite docs/api.md
    python tools/gen_api.py --check  # exit 1 if docs/api.md is out of date (tests run this)

The reference lists every name in ``somatize.__all__``, ``somatize.torch.__all__``,
``somatize.transports``, ``somatize.torch.federated`` and ``somatize.torch.lightning``: its signature and its
docstring's summary, arguments and example.
"""

from __future__ import annotations

import importlib
import inspect
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


def section(module_name: str, title: str) -> list[str]:
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
    return lines


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python tools/gen_api.py`; `make test` checks it is",
        "current. For the ideas behind the names, read [concepts](concepts.md).",
        "",
    ]
    for module_name, title in MODULES:
        lines += section(module_name, title)
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
