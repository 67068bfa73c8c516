"""``somatize runs``: list, show and clean the runs ``st.remember`` remembered.

    somatize runs ls   [--dir DIR]
    somatize runs show KEY [--dir DIR]
    somatize runs gc   [--older-than AGE] [--max-bytes N] [--dir DIR]

``--dir`` is the keeper's directory (``DiskKeeper("runs")`` → ``runs``); it defaults to
``$SOMATIZE_RUNS`` or ``runs``. KEY may be a unique prefix (12 digits, as ``ls`` shows).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

from . import runs

__all__ = ["add_parser", "byte_count", "command"]


def byte_count(text: str) -> int:
    """An argparse type: a size in bytes, 0 or more (``--max-bytes -5`` would empty the store)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a number of bytes: {text!r}; write e.g. 1000000000"
        ) from None
    if n < 0:
        raise argparse.ArgumentTypeError(
            f"{text} is below 0: write the size to shrink to, 0 or more (0 removes everything "
            "not pinned or running)"
        )
    return n


def add_parser(sub: Any) -> None:
    """Add the ``runs`` subcommand to the ``somatize`` parser's subparsers."""
    p = sub.add_parser("runs", help="list, show or clean runs remembered by st.remember")
    p.add_argument("action", choices=["ls", "show", "gc"])
    p.add_argument("key", nargs="?", help="for show: a run's key, or a unique prefix of it")
    p.add_argument("--dir", default=os.environ.get("SOMATIZE_RUNS", "runs"))
    p.add_argument("--older-than", help="for gc: forget runs unused this long (30m, 12h, 7d)")
    p.add_argument("--max-bytes", type=byte_count, help="for gc: then shrink to this many bytes")


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover


def _metrics(r: dict[str, Any]) -> str:
    shown = {k: v for k, v in r.get("metrics", {}).items() if k not in ("step", "epoch")}
    loss = r.get("result", {}).get("final_loss")
    if loss is not None:
        shown = {"loss": loss, **shown}
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()
    )


def _line(r: dict[str, Any]) -> str:
    fn = str(r.get("function", "?")).rsplit(".", 1)[-1]
    args = ", ".join(f"{k}={v}" for k, v in r.get("summary", {}).items())
    status = r.get("status", "?")
    tail = _metrics(r) if status == "done" else status
    return f"{str(r['key'])[:12]}  {_size(float(r['size'])):>9}  {fn}({args})  {tail}".rstrip()


def command(args: argparse.Namespace) -> int:
    """Run ``somatize runs ACTION``; returns the exit status."""
    store = runs.RunStore(os.path.join(args.dir, runs.FOLDER))
    if not store.root.is_dir():
        print(
            f"somatize: no remembered runs under {args.dir!r} (set --dir or $SOMATIZE_RUNS)",
            file=sys.stderr,
        )
        return 2
    records = store.records()
    if args.action == "ls":
        for r in sorted(records, key=lambda r: float(r["used"])):
            print(_line(r))
        done = sum(r.get("status") == "done" for r in records)
        print(f"{len(records)} runs ({done} finished), {_size(sum(r['size'] for r in records))}")
        return 0
    if args.action == "show":
        if not args.key:
            print("somatize: runs show needs a KEY (a prefix works)", file=sys.stderr)
            return 2
        found = [r for r in records if str(r["key"]).startswith(args.key)]
        if len(found) != 1:
            print(f"somatize: {len(found)} runs have a key starting {args.key!r}", file=sys.stderr)
            return 2
        r = found[0]
        r["used"] = datetime.datetime.fromtimestamp(float(r["used"])).isoformat(timespec="seconds")
        print(json.dumps(r, indent=2, sort_keys=True))
        return 0
    if args.older_than is None and args.max_bytes is None:
        print("somatize: runs gc needs --older-than AGE and/or --max-bytes N", file=sys.stderr)
        return 2
    try:
        age = runs.parse_age(args.older_than) if args.older_than is not None else None
    except ValueError as e:
        print(f"somatize: {e}", file=sys.stderr)
        return 2
    removed = runs.gc(args.dir, older_than=age, max_bytes=args.max_bytes)
    for r in removed:
        print(f"removed {_line(r)}")
    left = store.records()
    print(f"removed {len(removed)} runs; {len(left)} left, {_size(sum(r['size'] for r in left))}")
    return 0
