"""Run every benchmark side by side and report ratios: ``make bench`` (``python benchmarks/run.py``).

Writes ``benchmarks/results/latest.json`` and ``benchmarks/results/latest.md``, and
puts the table into ``docs/benchmarks.md`` (a run with ``--only`` writes
``results/only.*`` instead, and leaves the full run's figures alone). Each benchmark runs in a process of its
own, so none inherits what another left (a thread, a warm cache, a forkserver). A benchmark never fails the build: a
missed target is reported as such, and a benchmark that crashes is reported too.

    python benchmarks/run.py                 # everything (a few minutes on 2 cores)
    python benchmarks/run.py --quick         # fewer repetitions, smaller sizes
    python benchmarks/run.py --only dispatch training
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Row, fmt  # noqa: E402

BENCHMARKS = [
    "dispatch",
    "scaling",
    "keys",
    "training",
    "caching",
    "memory",
    "bounded",
    "keepers",
    "compile",
    "checkpoint",
    "level3",
    "federated",
    "remember",
]
MARK_BEGIN, MARK_END = "<!-- bench:begin -->", "<!-- bench:end -->"
# Tables a benchmark prints beside its rows (``TABLES`` in its module: the scaling grid)
TABLES_BEGIN, TABLES_END = "<!-- bench:tables:begin -->", "<!-- bench:tables:end -->"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table(rows: list[Row]) -> str:
    lines = [
        "| benchmark | case | somatize | baseline | ratio | ratio (CPU time) | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = f"{r.baseline}: {fmt(r.baseline_value, r.unit)}" if r.baseline else ""
        met = {True: "yes", False: "**MISSED**", None: ""}[r.met]
        value = fmt(r.value, r.unit) + (f" ({r.spread})" if r.spread else "")
        note = f" — {r.note}" if r.note else ""
        ratio = fmt(r.ratio, "x") if r.ratio is not None else ""
        cpu = fmt(r.cpu_ratio, "x") if r.cpu_ratio is not None else ""
        lines.append(
            f"| {r.benchmark} | {r.case}{note} | {value} | {base} | {ratio} | {cpu} "
            f"| {r.target} | {met} |"
        )
    return "\n".join(lines)


def isolated(name: str, quick: bool) -> tuple[list[Row], list[str]]:
    """Run benchmark ``name`` in a fresh process: what one benchmark leaves behind (a
    thread, a warm cache, a forkserver, the allocator's state) never moves another's
    figures. Returns its rows and tables; raises with its output if it crashed. Its
    temp files (TMPDIR: every ``mkdtemp`` of it and its workers) go with it, also when it
    crashed: before, the stores and checkpoints of a full run left about 1 GB in /tmp."""
    with tempfile.TemporaryDirectory(prefix="smz-bench-") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", str(out)]
        env = {**_env(), "TMPDIR": tmp}
        done = subprocess.run(cmd + (["--quick"] if quick else []), check=False, env=env)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"benchmark {name!r} exited with {done.returncode}")
        got = json.loads(out.read_text())
    return [Row(**r) for r in got["rows"]], got["tables"]


def _env() -> dict[str, str]:
    """The environment of a benchmark's process, with this checkout first on the import
    path: the package it measures (and its pools' workers import) is the one beside this
    file, not whichever one the environment has installed (an editable install points at
    one checkout, and a second worktree's run would measure it instead)."""
    root, before = str(HERE.parent), os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + before if before else "")}


def child(name: str, quick: bool, out: Path) -> int:
    bench = importlib.import_module(f"bench_{name}")
    got = bench.run(quick)
    tables = list(getattr(bench, "TABLES", {}).values())
    out.write_text(json.dumps({"rows": [r.as_dict() for r in got], "tables": tables}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller sizes")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these")
    parser.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # run one benchmark, write its rows
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.quick, Path(args.out))
    import torch

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": "make bench" + (" (--quick)" if args.quick else ""),
    }
    rows: list[Row] = []
    tables: list[str] = []
    failures: dict[str, str] = {}
    for name in args.only or BENCHMARKS:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            got, more = isolated(name, args.quick)
        except Exception:  # a benchmark reports, it never fails the build
            failures[name] = traceback.format_exc()
            print(failures[name], file=sys.stderr)
            continue
        rows.extend(got)
        tables.extend(more)
        print(table(got), flush=True)
        print(f"   ({time.perf_counter() - start:.0f} s)", flush=True)

    out = HERE / "results"
    out.mkdir(exist_ok=True)
    header = (
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), torch {meta['torch']}, "
        f"Python {meta['python']}, with `{meta['command']}`. Each figure is a median of "
        "interleaved trials after a warm-up, with its min–max; ratios are against a baseline "
        "measured in the same run, in wall time and (where read) in CPU time "
        "(`time.process_time`): on a loaded machine the two differ, and the CPU-time ratio "
        "is the one the load moves less."
    )
    md = header + "\n\n" + table(rows) + "\n"
    extra = "\n\n".join(tables)
    if failures:
        md += "\nBenchmarks that crashed: " + ", ".join(sorted(failures)) + "\n"
    # a partial run (--only) never replaces the full run's figures, which the docs quote
    stem = "only" if args.only else "latest"
    (out / f"{stem}.json").write_text(
        json.dumps(
            {"meta": meta, "rows": [r.as_dict() for r in rows], "failures": failures}, indent=2
        )
    )
    (out / f"{stem}.md").write_text(md + (f"\n{extra}\n" if extra else ""))
    print("\n" + md + (f"\n{extra}\n" if extra else ""))
    docs = HERE.parent / "docs" / "benchmarks.md"
    if not args.no_docs and not args.only and docs.exists():
        text = docs.read_text()
        if MARK_BEGIN in text and MARK_END in text:
            before, rest = text.split(MARK_BEGIN, 1)
            after = rest.split(MARK_END, 1)[1]
            text = f"{before}{MARK_BEGIN}\n{md}{MARK_END}{after}"
        if extra and TABLES_BEGIN in text and TABLES_END in text:
            before, rest = text.split(TABLES_BEGIN, 1)
            after = rest.split(TABLES_END, 1)[1]
            text = f"{before}{TABLES_BEGIN}\n{extra}\n{TABLES_END}{after}"
        docs.write_text(text)
        print(f"updated {docs.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
