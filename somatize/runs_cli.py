"""``somatize runs``: list, show and clean the runs ``st.remember`` remembered.

    somatize runs ls   [--dir DIR] [--keeper K]
    somatize runs show KEY [--dir DIR] [--keeper K]
    somatize runs gc   [--older-than AGE] [--max-bytes N] [--dir DIR] [--keeper K]

``--dir`` is the keeper's directory (``DiskKeeper("runs")`` → ``runs``, whose runs are
in ``runs/remembered``), or the directory given to ``st.remember(..., dir=DIR)``; it
defaults to ``$SOMATIZE_RUNS`` or ``runs``. For the latter, ``--keeper`` names the
keeper's directory (the results: ``gc`` removes them with their runs, ``ls`` and
``show`` see whether they are still there). KEY may be a unique prefix (12 digits, as
``ls`` shows).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import runs
from .counted import counted
from .errors import KeeperError
from .keepers.protocol import is_key
from .printable import printable

__all__ = ["add_parser", "byte_count", "cache_byte_count", "command", "locate"]


# (decimal, as the commands print sizes: 1.5 MB is 1,500,000 bytes; the binary units too)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9}
_UNITS |= {"gb": 10**9, "t": 10**12, "tb": 10**12}
_UNITS |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def byte_count(text: str, spared: str = "not pinned or running") -> int:
    """An argparse type: a size in bytes, 0 or more (``--max-bytes -5`` would empty the
    store), as a number or with a unit (``500M``, ``2GB``, ``1.5 GiB``: k, M, G, T are
    powers of 1000, as the commands print sizes, KiB... powers of 1024); ``spared``: what a
    gc to 0 leaves (for the message)."""
    number = text.strip().rstrip("BbIiKkMmGgTt ")
    unit = _UNITS.get(text.strip()[len(number) :].strip().lower())
    try:
        value = (int(number) if number.isdigit() else float(number)) if unit is not None else None
    except ValueError:
        value = None
    if value is None or unit is None or not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"not a number of bytes: {text!r}; write e.g. 1000000000, 500M, 2GB or 1.5GiB"
        )
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{text} is below 0: write the size to shrink to, 0 or more (0 removes everything "
            f"{spared})"
        )
    return int(value * unit)


def cache_byte_count(text: str) -> int:
    """``byte_count`` for ``somatize cache gc``, where nothing runs: 0 leaves the pinned."""
    return byte_count(text, "not pinned")


def add_parser(sub: Any) -> None:
    """Add the ``runs`` subcommand to the ``somatize`` parser's subparsers."""
    p = sub.add_parser("runs", help="list, show or clean runs remembered by st.remember")
    p.add_argument("action", choices=["ls", "show", "gc"])
    p.add_argument("key", nargs="?", help="for show: a run's key, or a unique prefix of it")
    p.add_argument(
        "--dir",
        default=os.environ.get("SOMATIZE_RUNS", "runs"),
        help="the keeper's directory, or the dir= given to st.remember",
    )
    p.add_argument("--keeper", help="the keeper's directory, when --dir is st.remember's dir=")
    p.add_argument("--older-than", help="for gc: forget runs unused this long (30m, 12h, 7d)")
    p.add_argument(
        "--max-bytes",
        type=byte_count,
        help="for gc: then shrink to this size (bytes, or 500M, 2GB)",
    )


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


def _stopped(r: dict[str, Any]) -> str:
    """How a finished run ended early, if it did: a pruner stopped it (an Optuna trial,
    early stopping) or its time budget ran out — not trained to its planned end."""
    result = r.get("result") or {}
    if result.get("pruned"):
        return f"  (pruned: {result.get('pruned_reason') or 'by its pruner'})"
    if result.get("timed_out"):
        return "  (timed out: Options(max_time=))"
    return ""


def _line(r: dict[str, Any]) -> str:
    """One run as ``ls`` shows it: its fields are a run.json's, so printed ``printable``."""
    return printable(_fields(r))


def _fields(r: dict[str, Any]) -> str:
    used = r.get("used")  # when it last ran or was recalled: tells runs of changed code apart
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(used)) if used else "?"
    head = f"{str(r['key'])[:12]}  {_size(float(r['size'])):>9}  {when}"
    status = r.get("status", "?")
    if status == "damaged":  # (its fields are not to be trusted: none is shown)
        return f"{head}  damaged record {r['record']}: {r['damage']}"
    fn = str(r.get("function", "?")).rsplit(".", 1)[-1]
    args = ", ".join(f"{k}={v}" for k, v in r.get("summary", {}).items())
    done = f"{_metrics(r)}{_stopped(r)}"
    tail = {"done": done, "collected": f"{done}  ({COLLECTED})"}.get(status, status)
    return f"{head}  {fn}({args})  {tail}".rstrip()


def _mend(r: dict[str, Any]) -> str:
    """The fix for a damaged record: what gc will not do for it."""
    return f"mend {r['record']} (or put back a copy), or remove {Path(r['record']).parent} by hand"


def locate(directory: str) -> tuple[runs.RunStore, str | None]:
    """The runs ``--dir`` names, and the keeper directory holding their results (None:
    unknown). A keeper's directory holds them in ``remembered/``; the directory given to
    ``st.remember(..., dir=...)`` holds them itself, one directory per key."""
    base = Path(directory)
    if (base / runs.FOLDER).is_dir() or not base.is_dir():
        return runs.RunStore(base / runs.FOLDER), directory
    try:
        own = any(is_key(p.name) and p.is_dir() for p in base.iterdir())
    except OSError:
        own = False
    return (runs.RunStore(base), None) if own else (runs.RunStore(base / runs.FOLDER), directory)


def _stored(keeper_dir: str | None, records: list[dict[str, Any]]) -> set[str] | None:
    """The keys the keeper holds (one listing), or None when it is not known."""
    if keeper_dir is None or not any(r.get("status") == "done" for r in records):
        return None
    from .keepers import DiskKeeper

    try:
        return set(DiskKeeper(keeper_dir, create=False).keys())
    except (KeeperError, OSError):
        return None


COLLECTED = "result collected (cache gc): the next call computes it again, from its checkpoints"


def command(args: argparse.Namespace) -> int:
    """Run ``somatize runs ACTION``; returns the exit status."""
    store, keeper_dir = locate(args.dir)
    if args.keeper is not None:
        if not os.path.isdir(os.path.join(args.keeper, "objects")):
            print(
                f"somatize: --keeper {args.keeper!r} is not a keeper's directory (it has no "
                "objects/); give the directory of the DiskKeeper st.remember stored results in",
                file=sys.stderr,
            )
            return 2
        keeper_dir = args.keeper
    if not store.root.is_dir():
        why = (
            f"it is a keeper's directory without {runs.FOLDER}/ — runs stored with "
            "st.remember(..., dir=DIR) are in DIR: pass --dir DIR (and this as --keeper)"
            if os.path.isdir(os.path.join(args.dir, "objects"))
            else f"neither a keeper's directory with {runs.FOLDER}/ nor a dir= given to "
            "st.remember (set --dir or $SOMATIZE_RUNS)"
        )
        print(f"somatize: no remembered runs under {args.dir!r}: {why}", file=sys.stderr)
        return 2
    records = store.records()
    stored = _stored(keeper_dir, records)
    for r in records:
        if stored is not None and r.get("status") == "done" and r["key"] not in stored:
            r["status"] = "collected"
            r["size"] -= int(r.get("bytes", 0))
    if args.action == "ls":
        for r in sorted(records, key=lambda r: float(r["used"])):
            print(_line(r))
        done = sum(r.get("status") in ("done", "collected") for r in records)
        collected = sum(r.get("status") == "collected" for r in records)
        gone = f", {collected} of them with the result collected" if collected else ""
        for what, field in (("pruned", "pruned"), ("timed out", "timed_out")):
            if n := sum(bool((r.get("result") or {}).get(field)) for r in records):
                gone += f", {n} {what}"
        if damaged := sum(r.get("status") == "damaged" for r in records):
            gone += f", {damaged} with a damaged record"
        total = _size(sum(r["size"] for r in records))
        print(f"{counted(len(records), 'run')} ({done} finished{gone}), {total}")
        if damaged:
            print(
                f"somatize: {counted(damaged, 'damaged run record')}, shown above with their paths; "
                "gc keeps them: mend each run.json, or remove its run's directory by hand",
                file=sys.stderr,
            )
        return 0
    if args.action == "show":
        if not args.key:
            print(
                "somatize: runs show needs a KEY (a prefix works), e.g. somatize runs show 3fa2; "
                "somatize runs ls lists the keys",
                file=sys.stderr,
            )
            return 2
        found = [r for r in records if str(r["key"]).startswith(args.key)]
        if len(found) != 1:
            fix = (
                "give more of the key (somatize runs ls lists them)"
                if found
                else "somatize runs ls lists the runs there are"
            )
            print(
                f"somatize: {len(found)} runs have a key starting {args.key!r}; {fix}",
                file=sys.stderr,
            )
            return 2
        r = found[0]
        r["used"] = datetime.datetime.fromtimestamp(float(r["used"])).isoformat(timespec="seconds")
        if r.get("status") == "collected":
            r["status"], r["collected"] = "done", COLLECTED
        print(json.dumps(r, indent=2, sort_keys=True))
        if r.get("status") == "damaged":
            print(
                f"somatize: the record of run {str(r['key'])[:12]} is damaged ({r['damage']}); "
                f"{_mend(r)} (runs gc keeps it: it cannot tell what the run is)",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.older_than is None and args.max_bytes is None:
        print(
            "somatize: runs gc needs --older-than AGE and/or --max-bytes N, e.g. "
            "somatize runs gc --older-than 30d",
            file=sys.stderr,
        )
        return 2
    try:
        age = runs.parse_age(args.older_than) if args.older_than is not None else None
    except ValueError as e:
        print(f"somatize: {e}", file=sys.stderr)
        return 2
    removed = runs.gc(keeper_dir, older_than=age, max_bytes=args.max_bytes, runs_dir=store.root)
    for r in removed:
        print(f"removed {_line(r)}")
    for r in records:  # what gc cannot judge, it keeps, and says so
        key = str(r["key"])[:12]
        if r.get("status") == "damaged":
            print(f"kept {key}: its record is damaged ({r['damage']}); {_mend(r)}")
        elif r.get("status") == "unreadable":
            print(
                f"kept {key}: this user cannot read its record {store.dir(r['key']) / 'run.json'}"
            )
    left = store.records()
    left_size = _size(sum(r["size"] for r in left))
    print(f"removed {counted(len(removed), 'run')}; {len(left)} left, {left_size}")
    if removed and keeper_dir is None:
        print(
            "their results stay in the keeper st.remember stored them in (pass --keeper DIR "
            "to remove them too, or run somatize cache gc on it)"
        )
    return 0
