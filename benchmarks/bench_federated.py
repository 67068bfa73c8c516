"""Federated rounds: N = 10, 100, 1,000 clients on 2 workers against serial and Flower; fedavg's
cost; partition and sampling cost.

* A round: digits (scikit-learn's bundled copy) split IID over N clients, a 64-64-10
  MLP, one local epoch of SGD (batch 10) per client, then ``fedavg``. The client seeds
  torch's CPU generator directly (``make_graph``: why), as the Trainer does. Serial is
  ``fl.map_clients(None, ...)``; the pool is ``st.executor(workers=2)`` warmed up,
  through ``fl.map_clients`` (the global state once per worker), and for reference
  the plain ``pool.map`` with the state in every task.
* Flower's simulation engine (``flwr[simulation]``, Ray) on identical work — the
  same client function, the same partitions, 2 CPUs — in a subprocess: start-up,
  per-round time and peak memory of the process tree. Flower is never a dependency
  of somatize: when it is not installed the benchmark says so.
* ``fedavg`` of 100 clients × 1M float32 parameters against one float32 accumulation
  pass and a float64 reference.
* Partition (Dirichlet α = 0.5) and sampling cost for 100k examples × 1,000 clients.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import Row, interleave, per_call
from federated_costs import fedavg_rows, partition_rows
from peak_rss import _rss_kib

HERE = Path(__file__).resolve().parent


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits as load

    x, y = load(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.long)


_DATA: dict[str, Any] = {}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    if "xy" not in _DATA:
        _DATA["xy"] = load_digits()
    return _DATA["xy"]  # type: ignore[no-any-return]


def make_graph() -> Any:
    from torch import nn

    from somatize import Done, Graph, Node, Opaque

    class Dense(Node):
        def __init__(self, i: int, o: int, relu: bool) -> None:
            self.lin, self.relu = nn.Linear(i, o), relu

        def forward(self, x: Any, ctx: Any) -> Done:
            h = self.lin(x)
            return Done(Opaque(torch.relu(h) if self.relu else h))

    # Seeds the CPU generator only, as the Trainer does: torch.manual_seed also queues a
    # lazy seed for each absent accelerator (CUDA, XPU, MTIA), formatting the whole Python
    # stack for each — measured 15–20% of this client's time in series, and 30% in a pool
    # worker, whose stack is deeper (the executor's frames under the client).
    torch.default_generator.manual_seed(0)
    return Graph.somatize(Dense(64, 64, True) >> Dense(64, 10, False))


def train_client(global_state: dict[str, torch.Tensor], task: tuple[Any, ...]) -> Any:
    """One client: load the global state, one epoch of SGD on its examples, a TrainResult."""
    from torch import nn

    import somatize.torch as st

    torch.set_num_threads(1)
    x, y, seed = task
    g = make_graph()
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05),
        epochs=1,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, list(zip(x.split(10), y.split(10))))


def tasks_for(n: int) -> list[tuple[Any, ...]]:
    from somatize.torch import federated as fl

    x, y = data()
    parts = fl.iid(len(y), clients=n, seed=0)
    return [(x[p], y[p], c) for c, p in enumerate(parts)]


def _naive(task: tuple[Any, ...]) -> Any:
    return train_client(task[0], task[1:])


def _warm(_: int) -> int:
    train_client(_state(), tasks_for(2)[0])
    return os.getpid()


def _state() -> dict[str, torch.Tensor]:
    import somatize.torch as st

    return st.state(make_graph())


def timed_client(global_state: dict[str, torch.Tensor], task: tuple[Any, ...]) -> Any:
    """``train_client``, the CPU seconds it took and the process that ran it."""
    start = time.process_time()
    result = train_client(global_state, task)
    return result, time.process_time() - start, os.getpid()


def rounds_rows(sizes: list[int], trials: int) -> tuple[list[Row], dict[int, float]]:
    """Wall time of each round (interleaved trials), and its CPU time: serial's is the
    parent's process time; the pool's critical path is the parent's process time plus
    the busiest worker's CPU time over the clients it ran (``map_clients`` hands batches
    to whichever worker is free), which is what the wall time would be on an idle
    machine."""
    import somatize.torch as st
    from somatize.torch import federated as fl

    state = _state()
    tasks = {n: tasks_for(n) for n in sizes}
    cpu: dict[str, list[float]] = {}
    parents: dict[str, list[float]] = {}  # the parent's own CPU time in map_clients

    def record(name: str, parent: float, out: list[Any]) -> Any:
        parents.setdefault(name, []).append(parent)
        per_worker: dict[int, float] = {}
        for _, dt, pid in out:
            if pid != os.getpid():  # run here, the clients' time is in the parent's already
                per_worker[pid] = per_worker.get(pid, 0.0) + dt
        cpu.setdefault(name, []).append(parent + max(per_worker.values(), default=0.0))
        return st.fedavg([r for r, *_ in out])

    def serial(n: int) -> Any:
        def go() -> Any:
            start = time.process_time()
            out = fl.map_clients(None, timed_client, tasks[n], shared=state)
            return record(f"serial {n}", time.process_time() - start, out)

        return go

    def pooled(n: int) -> Any:
        def go() -> Any:
            start = time.process_time()
            out = fl.map_clients(pool, timed_client, tasks[n], shared=state)
            return record(f"pool {n}", time.process_time() - start, out)

        return go

    def naive(n: int) -> Any:
        return lambda: st.fedavg(list(pool.map(_naive, [(state, *t) for t in tasks[n]])))

    # No sampling thread here: it would take CPU from the workers on 2 cores (psutil
    # scanning /proc every 50 ms) and, running when the pool starts, make st.executor
    # pick forkserver over fork. Peak memory is read afterwards from the kernel instead.
    start = time.perf_counter()
    pool = st.executor(workers=2)
    list(pool.map(_warm, range(2)))  # both workers up and past their first run
    startup = time.perf_counter() - start
    cands: dict[str, Any] = {}
    for n in sizes:
        cands[f"serial {n}"] = per_call(serial(n), 1)
        cands[f"pool {n}"] = per_call(pooled(n), 1)
    cands[f"naive {sizes[-1]}"] = per_call(naive(sizes[-1]), 1)
    t = interleave(cands, trials=trials, warmup=1)
    import psutil

    workers = [p.pid for p in psutil.Process().children(recursive=True)]
    peak = _rss_kib("VmRSS", os.getpid()) + sum(_rss_kib("VmHWM", pid) for pid in workers)
    pool.shutdown()
    load = os.getloadavg()[0]
    rows, per_round = [], {}
    for n in sizes:
        s, p = t[f"serial {n}"], t[f"pool {n}"]
        cs, cp = (statistics.median(cpu[f"{k} {n}"][1:]) for k in ("serial", "pool"))  # no warm-up
        per_round[n] = p.median
        target = "≥ 1.6× serial" if n == 1000 else ""
        rows.append(
            Row(
                "federated",
                f"a round of {n} clients on 2 workers (map_clients)",
                p.median,
                "s",
                baseline="the same round in series",
                baseline_value=s.median,
                ratio=s.median / p.median,
                target=target,
                met=(s.median / p.median >= 1.6) if target else None,
                spread=f"{p.min:.3f} – {p.max:.3f} s",
                cpu_ratio=cs / cp,
                note=(
                    f"wall-time speed-up; CPU critical path {cp:.3f} s against serial's "
                    f"{cs:.3f} s ({cs / cp:.2f}×), of which the parent's own (pickling tasks, "
                    f"unpickling results) {statistics.median(parents[f'pool {n}'][1:]):.3f} s; "
                    f"load average {load:.1f} on {os.cpu_count()} cores"
                ),
            )
        )
    n = sizes[-1]
    nv = t[f"naive {n}"]
    rows.append(
        Row(
            "federated",
            f"a round of {n} clients: map_clients against pool.map with the state in every task",
            t[f"pool {n}"].median,
            "s",
            baseline="pool.map",
            baseline_value=nv.median,
            ratio=nv.median / t[f"pool {n}"].median,
            note=(
                f"ratio: speed-up; pool start-up ({pool.start_method}) and warm-up {startup:.1f} s, "
                f"peak memory {peak / 2**10:.0f} MiB (the {len(workers)} workers' peak RSS and "
                "the parent's RSS after the rounds)"
            ),
        )
    )
    return rows, per_round


def flower_rows(sizes: list[int], per_round: dict[int, float]) -> list[Row]:
    try:
        import flwr  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        return [
            Row(
                "federated",
                "Flower simulation: not installed (pip install 'flwr[simulation]')",
                float("nan"),
                "s",
                note="Flower is never a dependency of somatize; the rows above stand alone",
            )
        ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(HERE / "flower_round.py"), ",".join(map(str, sizes))]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return [
            Row(
                "federated",
                "Flower simulation: could not run on this machine",
                float("nan"),
                "s",
                note=" / ".join(tail)[:300],
            )
        ]
    got = json.loads(lines[-1])
    rows = []
    for n in sizes:
        flwr_s = next(s for m, s in got["rounds"] if m == n)
        target = "≤ 1/5 of Flower" if n >= 100 else ""
        rows.append(
            Row(
                "federated",
                f"a round of {n} clients against Flower's simulation engine (2 CPUs)",
                per_round[n],
                "s",
                baseline="Flower (Ray)",
                baseline_value=flwr_s,
                ratio=per_round[n] / flwr_s,
                target=target,
                met=(per_round[n] / flwr_s <= 0.2) if target else None,
                note=(
                    f"Flower {got['version']}: start-up {got['startup']:.1f} s, "
                    f"peak memory {got['peak'] / 2**20:.0f} MiB"
                ),
            )
        )
    return rows


_CORUNNER = """
import sys, torch
torch.set_num_threads(1)
from bench_federated import _state, tasks_for, train_client
state, tasks = _state(), tasks_for(1000)
print("ready", flush=True)
while True:
    for t in tasks:
        train_client(state, t)
"""


def ceiling_rows(quick: bool) -> list[Row]:
    """What two cores can give this work at most: the CPU time of the same clients run
    alone, and beside another process training clients on the other core (two
    processes side by side, no pool, no pickling). Where the second core slows the
    first (shared physical cores under a VM, shared cache and memory bandwidth, a lower
    clock with both busy), two workers cannot reach 2x, whatever the pool does: the
    ceiling is 2 x alone / beside. A pure-Python busy loop is the lighter neighbour."""
    state, tasks = _state(), tasks_for(1000)[: 100 if quick else 250]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")])

    def clients() -> float:
        start = time.process_time()
        for t in tasks:
            train_client(state, t)
        return time.process_time() - start

    def beside(code: str) -> float:
        busy = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            if "ready" in code:
                assert busy.stdout is not None and busy.stdout.readline().strip() == "ready"
            time.sleep(0.2)  # running on the other core
            return clients()
        finally:
            busy.kill()
            busy.wait()

    clients()
    got: dict[str, list[float]] = {"alone": [], "training": [], "loop": []}
    for _ in range(1 if quick else 3):  # interleaved
        got["alone"].append(clients())
        got["training"].append(beside(_CORUNNER))
        got["loop"].append(beside("while True: pass"))
    a, b, c = (statistics.median(got[k]) for k in ("alone", "training", "loop"))
    return [
        Row(
            "federated",
            f"ceiling: {len(tasks)} clients' CPU time beside another process training clients",
            b,
            "s",
            baseline="the same clients alone",
            baseline_value=a,
            ratio=b / a,
            note=(
                f"two workers can be at most {2 * a / b:.2f}× faster than one on this machine "
                f"(2 × alone / beside), before any pickling or imbalance; beside a pure-Python "
                f"busy loop {c / a:.2f}× alone"
            ),
        )
    ]


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(1)
    sizes = [10, 100] if quick else [10, 100, 1000]
    rows, per_round = rounds_rows(sizes, trials=1 if quick else 2)
    rows += ceiling_rows(quick)
    if quick:  # Ray's start-up alone takes longer than the whole quick run
        rows.append(Row("federated", "Flower simulation: skipped with --quick", float("nan"), "s"))
    else:
        rows += flower_rows(sizes, per_round)
    rows += fedavg_rows(quick)
    rows += partition_rows(per_round)
    return rows


if __name__ == "__main__":
    from run import table

    print(table(run("--quick" in sys.argv)))
