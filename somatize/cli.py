"""The ``somatize`` command: inspect and tend a disk cache, draw a graph.

    somatize cache stats  [--dir DIR]
    somatize cache verify [--dir DIR]
    somatize cache gc --max-bytes N [--dir DIR]
    somatize cache ls     [--dir DIR]
    somatize graph MODULE:ATTR [--format mermaid|text]
    somatize runs ls|show KEY|gc  (runs remembered by st.remember; see somatize.runs_cli)

``--dir`` defaults to ``$SOMATIZE_CACHE`` or ``.somatize-cache``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from . import runs_cli
from .graph import Graph
from .keepers import DiskKeeper

__all__ = ["main"]


def _cache(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        print(f"somatize: no cache at {args.dir!r} (set --dir or $SOMATIZE_CACHE)", file=sys.stderr)
        return 2
    keeper = DiskKeeper(args.dir)
    if args.action == "stats":
        print(keeper.stats())
    elif args.action == "verify":
        bad = keeper.verify()
        for key in bad:
            print(f"removed corrupt entry {key}")
        print(f"{len(bad)} corrupt entries removed; {keeper.stats()}")
        return 1 if bad else 0
    elif args.action == "gc":
        if args.max_bytes is None:
            print("somatize: cache gc needs --max-bytes N", file=sys.stderr)
            return 2
        freed = keeper.gc(args.max_bytes)
        print(f"freed {freed} bytes; {keeper.stats()}")
    else:
        names = {key: name for name, key in keeper.names().items()}
        for key in keeper.keys():  # noqa: SIM118 -- a keeper, not a dict
            try:
                size = (keeper.path / "objects" / key[:2] / key).stat().st_size
            except FileNotFoundError:  # removed meanwhile by another process
                continue
            print(f"{key}  {size:>10}  {names.get(key, '')}".rstrip())
    return 0


def _graph(args: argparse.Namespace) -> int:
    module_name, _, attr = args.target.partition(":")
    if not attr:
        print(
            "somatize: give the graph as MODULE:ATTR, e.g. recipes.text_pipeline:graph",
            file=sys.stderr,
        )
        return 2
    if os.getcwd() not in sys.path:  # modules of the directory the command runs in
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        print(f"somatize: cannot load {args.target}: {e}", file=sys.stderr)
        return 2
    if callable(obj) and not isinstance(obj, Graph):
        obj = obj()
    if not isinstance(obj, Graph):
        print(
            f"somatize: {args.target} is a {type(obj).__qualname__}, not a Graph", file=sys.stderr
        )
        return 2
    print(obj.to_mermaid() if args.format == "mermaid" else obj.to_text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="somatize", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cache = sub.add_parser("cache", help="inspect or tend a DiskKeeper cache")
    cache.add_argument("action", choices=["stats", "verify", "gc", "ls"])
    cache.add_argument("--dir", default=os.environ.get("SOMATIZE_CACHE", ".somatize-cache"))
    cache.add_argument("--max-bytes", type=int, default=None, help="for gc: the size to shrink to")
    graph = sub.add_parser("graph", help="draw a graph defined in a module")
    graph.add_argument("target", help="MODULE:ATTR naming a Graph, or a function returning one")
    graph.add_argument("--format", choices=["mermaid", "text"], default="text")
    runs_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "runs":
        return runs_cli.command(args)
    return _cache(args) if args.command == "cache" else _graph(args)


if __name__ == "__main__":
    sys.exit(main())
