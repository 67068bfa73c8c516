"""The ``somatize`` command: inspect and tend a disk cache, draw a graph.

    somatize cache stats  [--dir DIR]
    somatize cache verify [--dir DIR]
    somatize cache gc --max-bytes N [--dir DIR]
    somatize cache ls     [--dir DIR]
    somatize cache explain GRAPH INPUT [--dir DIR]     # GRAPH, INPUT: MODULE:ATTR
    somatize graph MODULE:ATTR [--format mermaid|text]
    somatize checkpoint verify DIR|FILE
    somatize runs ls|show KEY|gc  (runs remembered by st.remember; see somatize.runs_cli)

``--dir`` defaults to ``$SOMATIZE_CACHE`` or ``.somatize-cache``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import runs_cli
from .compose import Composable
from .counted import counted
from .errors import KeeperError, SomatizeError
from .graph import Graph
from .keepers import DiskKeeper
from .rows import check_entry
from .values import decode

__all__ = ["main"]


class _Damaged(Exception):
    """A codec here could not read a value written in its name."""


class _Judged:
    """A codec whose failures are told apart from bytes that are not an encoded value."""

    def __init__(self, codec: Any) -> None:
        self.tag, self._codec = codec.tag, codec

    def decode(self, data: bytes) -> Any:
        try:
            return self._codec.decode(data)
        except Exception as e:
            raise _Damaged(f"codec {self.tag!r}") from e


def _decoder(foreign: list[int]) -> Callable[[bytes], object]:
    """What ``cache verify`` decodes each payload with: the data codecs, and the torch
    codecs when torch is importable. A value a codec here cannot read (a tensor of the
    wrong size) is removed; a payload that is not an encoded value — bytes the user stored
    themselves (a keeper stores bytes), or written by a codec that is not here — is intact
    (its checksum held) and not ours to judge: it is kept and counted in ``foreign``."""
    codecs: tuple[Any, ...] = ()
    try:
        from .torch.codecs import default_codecs
    except ImportError:  # torch not installed: tensor entries are kept unjudged
        pass
    else:
        codecs = default_codecs()

    def check(payload: bytes) -> object:
        if check_entry(payload, codecs):  # a per-example row (somatize.rows): raises if torn
            return None
        try:
            return decode(payload, judged)  # type: ignore[arg-type]  # (tag and decode only)
        except _Damaged as e:  # a value of a codec here that does not fit: ours, removed
            raise ValueError(str(e.__cause__)) from e
        except Exception:  # (struct.error, UnicodeDecodeError... for bytes of another form)
            foreign[0] += 1
            return None

    judged = tuple(_Judged(c) for c in codecs)

    return check


def _explain(args: argparse.Namespace) -> int:
    """Why each cached node of GRAPH would hit or miss on INPUT (``Graph.explain``)."""
    if len(args.targets) != 2:
        print(
            f"somatize: cache explain needs GRAPH and INPUT, each MODULE:ATTR (given "
            f"{len(args.targets)}), e.g. somatize cache explain {_EXAMPLE[True]} {_EXAMPLE[False]}",
            file=sys.stderr,
        )
        return 2
    g, x = _load(args.targets[0]), _load(args.targets[1], graph=False)
    if g is _FAILED or x is _FAILED:
        return 2
    if g.keeper is None:  # a graph without its own keeper is explained against --dir
        keeper = _open(args.dir)
        if keeper is None:
            return 2
        g.keeper = keeper
    if "torch" in sys.modules:  # the graph's module uses torch: give it the torch runtime
        from .torch import module

        module(g)
    try:
        print(g.explain(x))
    except SomatizeError as e:  # an empty graph, an input that cannot be keyed...
        print(
            f"somatize: cannot explain {args.targets[0]} on {args.targets[1]}: {e}", file=sys.stderr
        )
        return 2
    return 0


def _cache(args: argparse.Namespace) -> int:
    if args.action == "explain":
        return _explain(args)
    if args.targets:
        print(
            f"somatize: cache {args.action} takes no MODULE:ATTR arguments (given "
            f"{' '.join(args.targets)}); only cache explain does",
            file=sys.stderr,
        )
        return 2
    if args.action == "gc" and args.max_bytes is None:
        print(
            "somatize: cache gc needs --max-bytes N, the size to shrink the cache to; "
            "e.g. somatize cache gc --max-bytes 1000000000",
            file=sys.stderr,
        )
        return 2
    keeper = _open(args.dir)
    if keeper is None:
        return 2
    try:
        return _tend(keeper, args)
    except KeeperError as e:
        print(f"somatize: {e}", file=sys.stderr)
        return 1


def _open(path: str) -> DiskKeeper | None:
    """The cache at ``path``; None after saying why there is none (exit status 2). No
    cache is created: a directory that is not one is an error, not a new cache."""
    if not path:
        print(
            "somatize: the cache directory is an empty path ($SOMATIZE_CACHE is set but "
            "empty, or --dir ''); give the directory a DiskKeeper wrote with --dir DIR, or "
            "unset SOMATIZE_CACHE for the default .somatize-cache",
            file=sys.stderr,
        )
        return None
    try:
        return DiskKeeper(path, create=False)
    except KeeperError as e:
        print(f"somatize: {e}", file=sys.stderr)  # (it names the directory)
        return None


def _tend(keeper: DiskKeeper, args: argparse.Namespace) -> int:
    if args.action == "stats":
        print(keeper.stats())
    elif args.action == "verify":
        foreign = [0]
        bad = keeper.verify(decode=_decoder(foreign))
        for key in bad:
            if key not in bad.packs:
                print(f"removed corrupt entry {key}")
                continue
            held = bad.packs[key]
            what = f"its {_entries(held)}" if held else "its entries (they could not be counted)"
            print(f"removed {key}, a pack whose index is damaged, with {what}")
        if foreign[0]:
            print(
                f"{_entries(foreign[0], 'intact ')} "
                + ("is not a somatize value" if foreign[0] == 1 else "are not somatize values")
                + " (bytes stored through the keeper, or a codec not importable here): kept"
            )
        lost = _entries(bad.entries, "corrupt ")
        print(f"{'at least ' if bad.uncounted else ''}{lost} removed; {keeper.stats()}")
        return 1 if bad else 0
    elif args.action == "gc":
        freed = keeper.gc(args.max_bytes)
        print(f"freed {counted(freed, 'byte')}; {keeper.stats()}")
    else:
        names = {key: name for name, key in keeper.names().items()}
        for key, size in keeper.sizes():
            print(f"{key}  {size:>10}  {names.get(key, '')}".rstrip())
    return 0


def _entries(n: int, what: str = "") -> str:
    """``"1 corrupt entry"``, ``"10 corrupt entries"``."""
    return counted(n, f"{what}entry")


_FAILED = object()  # what _load gives after an error (None is an input like another)
_EXAMPLE = {True: "recipes.text_pipeline:graph", False: "recipes.text_pipeline:batch"}


def _load(target: str, graph: bool = True) -> Any:
    """The object MODULE:ATTR names (called if it is a function); ``_FAILED`` after an
    error, which it has printed. An error raised inside the user's module or factory is
    theirs, and keeps its traceback."""
    what = "the graph" if graph else "the input"
    module_name, _, attr = target.partition(":")
    if not _dotted(module_name) or not _dotted(attr):  # (":g" and ".mod:g" fail in import)
        print(
            f"somatize: {what} {target!r} is not MODULE:ATTR: a module importable from the "
            f"current directory, a colon and a name in it, e.g. {_EXAMPLE[graph]}",
            file=sys.stderr,
        )
        return _FAILED
    if os.getcwd() not in sys.path:  # modules of the directory the command runs in
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        print(f"somatize: cannot load {target}: {e}", file=sys.stderr)
        return _FAILED
    if callable(obj) and not isinstance(obj, Composable):  # a factory (a node is none)
        needs, name = _parameters(obj), getattr(obj, "__name__", attr)
        if needs is not None:
            print(
                f"somatize: cannot load {target}: {name}({needs}) takes arguments, and the "
                f"command passes none; name {what} itself, or a function taking none and "
                f"returning {what} (e.g. def make(): return {name}(...))",
                file=sys.stderr,
            )
            return _FAILED
        obj = obj()
    if graph and not isinstance(obj, Graph):
        build = (
            "; build it there: graph = Graph.somatize(...)" if isinstance(obj, Composable) else ""
        )
        print(
            f"somatize: {target} is a {type(obj).__qualname__}, not a Graph{build}",
            file=sys.stderr,
        )
        return _FAILED
    return obj


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _parameters(fn: Callable[..., Any]) -> str | None:
    """The parameters ``fn`` needs (``"width"``), or None when it can be called bare —
    told before the call, so that a TypeError raised inside it stays the user's."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): call it
        return None
    try:
        signature.bind()
    except TypeError:
        return ", ".join(
            str(p)
            for p in signature.parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )
    return None


def _graph(args: argparse.Namespace) -> int:
    obj = _load(args.target)
    if obj is _FAILED:
        return 2
    try:
        print(obj.to_mermaid() if args.format == "mermaid" else obj.to_text())
    except SomatizeError as e:  # an empty graph
        print(f"somatize: cannot draw {args.target}: {e}", file=sys.stderr)
        return 2
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    """``checkpoint verify``: torch is imported here, never by the core command."""
    try:
        from .torch.verify import verify_command
    except ImportError as e:
        print(
            f"somatize: checkpoint commands need torch ({e}); pip install 'somatize[torch]'",
            file=sys.stderr,
        )
        return 2
    return verify_command(args.path)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``somatize`` command. Output piped into a reader that stops early
    (``somatize cache ls | head``) ends it quietly, as other shell tools do."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at nothing, so that the closed
        # pipe raises no second error there.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool a pipe stopped


_CACHE_ACTIONS = """actions:
  stats    entries, bytes, pinned, names and packs (reads one listing, writes nothing)
  ls       each entry's key, size on disk and name
  verify   check every entry's checksum and decode it; remove the bad ones (exit 1 if any)
  gc       remove the least recently used unpinned entries down to --max-bytes
  explain  GRAPH INPUT (MODULE:ATTR each): g.explain(x), against --dir if the graph has
           no keeper of its own; writes nothing"""


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="somatize", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cache = sub.add_parser(
        "cache",
        help="inspect or tend a DiskKeeper cache",
        epilog=_CACHE_ACTIONS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cache.add_argument("action", choices=["stats", "verify", "gc", "ls", "explain"])
    cache.add_argument(  # (a default, or argparse calls the optional targets "required")
        "targets", nargs="*", default=[], help="for explain: GRAPH and INPUT as MODULE:ATTR"
    )
    cache.add_argument(
        "--dir",
        default=os.environ.get("SOMATIZE_CACHE", ".somatize-cache"),
        help="the DiskKeeper directory (default: $SOMATIZE_CACHE, else .somatize-cache)",
    )
    cache.add_argument(
        "--max-bytes",
        type=runs_cli.cache_byte_count,
        default=None,
        help="for gc: the size to shrink to (bytes, or 500M, 2GB, 1.5GiB)",
    )
    graph = sub.add_parser("graph", help="draw a graph defined in a module")
    graph.add_argument("target", help="MODULE:ATTR naming a Graph, or a function returning one")
    graph.add_argument("--format", choices=["mermaid", "text"], default="text")
    checkpoint = sub.add_parser("checkpoint", help="verify Trainer checkpoints")
    checkpoint.add_argument("action", choices=["verify"])
    checkpoint.add_argument("path", help="a checkpoint directory, or one checkpoint file")
    runs_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "checkpoint":
        return _checkpoint(args)
    if args.command == "runs":
        return runs_cli.command(args)
    return _cache(args) if args.command == "cache" else _graph(args)


if __name__ == "__main__":
    sys.exit(main())
