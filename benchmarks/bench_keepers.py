"""Keepers: MemoryKeeper put as it grows; DiskKeeper against hand-written file code.

* ``MemoryKeeper.put`` into a full keeper (every put evicts one) holding 100k
  entries against the same at 1k: flat means O(1).
* ``DiskKeeper`` holding 100k single-``put`` entries (10k with ``--quick``), against a
  hand-written store of the same files in the same two-level layout:
  ``put`` vs temp file + write + rename; ``get`` vs open + read;
  ``stats()`` and ``gc`` (nothing to free: the scan and the ranking) vs one
  scandir + stat of every file.
* The same entries stored as per-example batches (``put_many`` of 64): ``stats()``
  and ``gc`` against the scan of the one-file-per-entry store.
* Per-example entries: 10k entries of 2 KB stored and read in batches of 64
  (``put_many``/``get_many``, a DataLoader's batch) against one ``put``/``get`` each.
* A DiskKeeper filled as a cold epoch fills it (a pack, then a lookup that misses, per
  batch): the lookup at 2,000 packs against at 100, which should stay flat.

Every pair is timed interleaved (A B A B ...); the figure is the wall-time median with
its min–max, and the note gives the ratio of CPU time (``time.process_time``) too, so
a loaded machine neither hides nor invents a regression. Neither side fsyncs: a cache
entry is verified on every read, so a file a power failure tore is a miss, and the
rename alone makes a write atomic against a killed process.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from common import Row, Timing, interleave, spread

from somatize import DiskKeeper, MemoryKeeper


def key(i: int) -> str:
    return f"{i:064x}"


class Clock:
    """Candidates for ``interleave`` that also keep CPU seconds per operation."""

    def __init__(self) -> None:
        self.cpu: dict[str, list[float]] = {}

    def op(self, name: str, fn: Callable[[int], object], number: int) -> Callable[[], float]:
        counter = iter(range(1 << 62))

        def run() -> float:
            trial = next(counter)
            c, w = time.process_time(), time.perf_counter()
            for i in range(number):
                fn(trial * number + i)
            wall = (time.perf_counter() - w) / number
            self.cpu.setdefault(name, []).append((time.process_time() - c) / number)
            return wall

        return run

    def cpu_ratio(self, a: str, b: str) -> float:
        return statistics.median(self.cpu[a]) / max(statistics.median(self.cpu[b]), 1e-12)


def row(
    case: str,
    ours: Timing,
    base: Timing,
    baseline: str,
    target: float | None,
    cpu: float,
    unit: str = "µs",
) -> Row:
    scale = 1e6 if unit == "µs" else 1e3
    ratio = ours.median / base.median
    return Row(
        "keepers",
        case,
        ours.median * scale,
        unit,
        baseline=baseline,
        baseline_value=base.median * scale,
        ratio=ratio,
        target=f"≤ {target}×" if target is not None else "",
        met=None if target is None else ratio <= target,
        spread=spread(ours, scale, unit),
        note=f"CPU-time ratio {cpu:.2f}×",
    )


def memory_rows(quick: bool) -> list[Row]:
    clock = Clock()
    size, number = 64, 5000
    small, big = MemoryKeeper(max_bytes=1000 * size), MemoryKeeper(max_bytes=100_000 * size)
    for keeper, n in ((small, 1000), (big, 100_000)):
        keeper.put_many([(key(i), bytes(size)) for i in range(n)])
    data = bytes(size)
    keys = [key(1 << 40 | i) for i in range(number * 20)]
    t = interleave(
        {
            "1k": clock.op("1k", lambda i: small.put(keys[i], data), number),
            "100k": clock.op("100k", lambda i: big.put(keys[i], data), number),
        },
        trials=3 if quick else 7,
    )
    assert len(big) == 100_000 and big.stats().evicted > 0  # full: each put evicted one
    return [
        row(
            "MemoryKeeper.put at 100k entries (full: each put evicts)",
            t["100k"],
            t["1k"],
            "put at 1k entries",
            2.0,
            clock.cpu_ratio("100k", "1k"),
        )
    ]


class Bare:
    """The hand-written baseline: payload files in ``ab/<key>``, nothing else."""

    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, k: str) -> str:
        return f"{self.root}/{k[:2]}/{k}"

    def put(self, k: str, data: bytes, sync: bool = True) -> None:
        path = self.path(k)
        tmp = path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        if sync:
            os.fsync(fd)
        os.close(fd)
        os.replace(tmp, path)

    def get(self, k: str) -> bytes:
        with open(self.path(k), "rb") as f:
            return f.read()

    def scan(self) -> tuple[int, int]:
        n = total = 0
        for sub in os.scandir(self.root):
            for e in os.scandir(sub.path):
                total += e.stat().st_size
                n += 1
        return n, total


def disk_rows(quick: bool, root: str) -> list[Row]:
    n = 10_000 if quick else 100_000
    size, trials = 145, 3 if quick else 5
    clock = Clock()
    keeper, bare = DiskKeeper(f"{root}/keeper"), Bare(f"{root}/bare")
    payload = bytes(range(145))
    for i in range(n):
        keeper.put(key(i), payload)
        bare.put(key(i), payload, sync=False)
    rnd = random.Random(0)
    reads = [key(rnd.randrange(n)) for _ in range(200_000)]
    writes = [key(1 << 50 | i) for i in range(20_000)]
    puts = 50 if quick else 100
    t = interleave(
        {
            "put": clock.op("put", lambda i: keeper.put(writes[i], payload), puts),
            "bare put": clock.op(
                "bare put", lambda i: bare.put(writes[i], payload, sync=False), puts
            ),
            "get": clock.op("get", lambda i: keeper.get(reads[i]), 2000),
            "bare get": clock.op("bare get", lambda i: bare.get(reads[i]), 2000),
        },
        trials=trials,
    )
    scans = interleave(
        {
            "stats": clock.op("stats", lambda i: keeper.stats(), 1),
            "gc": clock.op("gc", lambda i: keeper.gc(1 << 50), 1),
            "scan": clock.op("scan", lambda i: bare.scan(), 1),
        },
        trials=trials,
    )
    assert keeper.stats().entries == bare.scan()[0]
    packed = DiskKeeper(f"{root}/packed")  # the same entries as per-example batches
    for s in range(0, n, 64):
        packed.put_many([(key(i), payload) for i in range(s, min(n, s + 64))])
    by_pack = interleave(
        {
            "packed stats": clock.op(
                "packed stats", lambda i: DiskKeeper(packed.path).stats(), 1
            ),  # a fresh handle: it reads every pack's index, as `somatize cache stats` does
            "packed gc": clock.op("packed gc", lambda i: packed.gc(1 << 50), 1),
            "scan 2": clock.op("scan 2", lambda i: bare.scan(), 1),
        },
        trials=trials,
    )
    assert DiskKeeper(packed.path).stats().entries == n
    label = f"{n // 1000}k entries of {size} B"
    return [
        row(f"DiskKeeper.put, {label}", t["put"], t["bare put"], "tmp+write+rename", 1.2,
            clock.cpu_ratio("put", "bare put")),
        row(f"DiskKeeper.get, {label}", t["get"], t["bare get"], "open+read", 1.2,
            clock.cpu_ratio("get", "bare get")),
        row(f"DiskKeeper.stats(), {label}", scans["stats"], scans["scan"], "scandir+stat", 1.5,
            clock.cpu_ratio("stats", "scan"), unit="ms"),
        row(f"DiskKeeper.gc (nothing to free), {label}", scans["gc"], scans["scan"],
            "scandir+stat", 1.5, clock.cpu_ratio("gc", "scan"), unit="ms"),
        row(f"DiskKeeper.stats(), {label} in packs of 64 (a new handle)", by_pack["packed stats"],
            by_pack["scan 2"], "scandir+stat of the files", None,
            clock.cpu_ratio("packed stats", "scan 2"), unit="ms"),
        row(f"DiskKeeper.gc (nothing to free), {label} in packs of 64", by_pack["packed gc"],
            by_pack["scan 2"], "scandir+stat of the files", None,
            clock.cpu_ratio("packed gc", "scan 2"), unit="ms"),
    ]  # fmt: skip


def batch_rows(quick: bool, root: str) -> list[Row]:
    n, size, batch = (2000 if quick else 10_000), 2048, 64
    clock = Clock()
    payloads = [os.urandom(size) for _ in range(64)]
    runs = iter(range(1 << 30))

    def store_batches(single: bool) -> Callable[[], float]:
        def run() -> float:
            keeper = DiskKeeper(f"{root}/batch-{next(runs)}")
            items = [(key(i), payloads[i % 64]) for i in range(n)]
            c, w = time.process_time(), time.perf_counter()
            for s in range(0, n, batch):
                if single:
                    for k, v in items[s : s + batch]:
                        keeper.put(k, v)
                else:
                    keeper.put_many(items[s : s + batch])
            wall = (time.perf_counter() - w) / n
            name = "put" if single else "put_many"
            clock.cpu.setdefault(name, []).append((time.process_time() - c) / n)
            readers[name] = keeper
            return wall

        return run

    readers: dict[str, DiskKeeper] = {}
    trials = 2 if quick else 3
    t = interleave(
        {"put_many": store_batches(False), "put": store_batches(True)}, trials=trials, warmup=0
    )
    order = list(range(n))
    random.Random(1).shuffle(order)  # a shuffled loader: batches never repeat
    batches = [[key(i) for i in order[s : s + batch]] for s in range(0, n, batch)]
    many, single = DiskKeeper(readers["put_many"].path), DiskKeeper(readers["put"].path)

    def get_batches(keeper: DiskKeeper, one: bool) -> Callable[[int], object]:
        def run(_: int) -> None:
            for b in batches:
                got = [keeper.get(k) for k in b] if one else keeper.get_many(b)
                assert None not in got

        return run

    g = interleave(
        {
            "get_many": clock.op("get_many", get_batches(many, False), 1),
            "get": clock.op("get", get_batches(single, True), 1),
        },
        trials=trials + 2,
    )
    g = {name: tm.scaled(1 / n) for name, tm in g.items()}
    for name in ("get_many", "get"):
        clock.cpu[name] = [c / n for c in clock.cpu[name]]
    label = f"{n // 1000}k entries of 2 KB, batches of {batch}"
    return [
        row(f"put_many per entry, {label}", t["put_many"], t["put"], "put per entry", None,
            clock.cpu_ratio("put_many", "put")),
        row(f"get_many per entry, {label} (shuffled)", g["get_many"], g["get"],
            "get per entry", None, clock.cpu_ratio("get_many", "get")),
    ]  # fmt: skip


def fill_rows(quick: bool, root: str) -> list[Row]:
    """The lookup of a DiskKeeper being filled as a cold epoch fills it — a pack of 32
    entries written, then a ``get_many`` of 32 other keys it does not hold — at many packs
    against at few. Only the lookup is timed (the writes are the filesystem's, and grow
    with the directory): flat means a lookup does not rescan the directory for every
    pack the handle wrote itself."""
    few, many, window = 100, (1000 if quick else 2000), 50
    payload = os.urandom(512)
    keepers = {}
    for name, packs in (("few", few), ("many", many)):
        keepers[name] = keeper = DiskKeeper(f"{root}/fill-{name}")
        for b in range(packs):
            keeper.put_many([(key(b << 8 | i), payload) for i in range(64)])
    fresh = iter(range(1 << 40, 1 << 62))
    cpu: dict[str, list[float]] = {}

    def lookups(keeper: DiskKeeper, name: str) -> Callable[[], float]:
        def run() -> float:
            wall = spent = 0.0
            for _ in range(window):
                keys = [key(next(fresh)) for _ in range(64)]
                keeper.put_many([(k, payload) for k in keys[:32]])  # this batch's pack
                c, w = time.process_time(), time.perf_counter()
                keeper.get_many(keys[32:])  # the next batch's lookup: every key a miss
                wall += time.perf_counter() - w
                spent += time.process_time() - c
            cpu.setdefault(name, []).append(spent / window)
            return wall / window

        return run

    t = interleave(
        {name: lookups(keepers[name], name) for name in ("many", "few")},
        trials=3 if quick else 7,
    )
    by_cpu = statistics.median(cpu["many"]) / statistics.median(cpu["few"])
    ratio = t["many"].median / t["few"].median
    return [
        Row(
            "keepers",
            f"DiskKeeper lookup while it is filled a batch at a time (put_many, then a "
            f"get_many of 32 keys it does not hold), at {many:,} packs against at {few}",
            t["many"].median * 1e6,
            "µs",
            baseline=f"the same at {few} packs",
            baseline_value=t["few"].median * 1e6,
            ratio=ratio,
            cpu_ratio=by_cpu,
            target="≤ 1.5×",
            met=ratio <= 1.5,
            spread=spread(t["many"], 1e6, "µs"),
        )
    ]


def run(quick: bool) -> list[Row]:
    root = tempfile.mkdtemp(prefix="somatize-bench-keepers-")
    try:
        return (
            memory_rows(quick)
            + disk_rows(quick, root)
            + batch_rows(quick, root)
            + fill_rows(quick, root)
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    import argparse
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from run import table

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    print(table(run(parser.parse_args().quick)))
