"""Remembered runs: a finished campaign rerun, and a federated loop killed at round 7 of 10.

* **Campaign rerun.** Five seeds of a small training run through ``st.remember`` into
  a fresh keeper (the first run), then the same five calls again (all recalled). Target:
  the rerun takes at most 5% of the first run. Also reported: the first remembered run
  against the same five calls not remembered (what keying, storing and recording cost).
* **Federated resume.** A 10-round FedAvg loop of remembered client runs in a child
  process. Uninterrupted, it reports when each round ended. Another one, on a fresh
  keeper, is SIGKILLed once round 7 has ended; the loop is then run again. Target: the
  rerun's loop takes at most 1.2× the time the uninterrupted run spent on rounds 8–10
  (the 3 missing rounds); its final state ``torch.equal`` to the uninterrupted one.
  Times are measured inside the child, from the loop's start: the interpreter and torch
  import, the same for any run of a script, are left out (and given in the note).

Wall time is the figure; CPU time (``time.process_time``) is given beside it.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Row

HERE = Path(__file__).resolve().parent
ROUNDS, KILL_AFTER, CLIENTS = 10, 7, 4


def _modules():  # torch and somatize.torch, imported where used
    import torch
    from torch import nn

    import somatize.torch as st
    from somatize import Done, Graph, Node, Opaque

    class Mlp(Node):
        def __init__(self) -> None:
            self.net = nn.Sequential(
                nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
            )

        def forward(self, x, ctx):
            return Done(Opaque(self.net(x)))

    return torch, nn, st, Graph, Mlp


def batches(seed: int, n: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen))
        for _ in range(n)
    ]


def train_seed(seed: int, data: list, epochs: int = 5):
    torch, nn, st, Graph, Mlp = _modules()
    torch.manual_seed(seed)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        epochs=epochs,
        metrics={"acc": st.accuracy},
        checkpoint=st.run_checkpointing(),  # each epoch
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(Graph.somatize(Mlp()), data, val=data[:2], resume="last")


def train_client(global_state: dict, shard: list, round: int):
    torch, nn, st, Graph, Mlp = _modules()
    torch.manual_seed(0)
    g = Graph.somatize(Mlp())
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05),
        epochs=3,
        checkpoint=st.run_checkpointing(),
        seed=round,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, shard, resume="last")


def _warm_up(torch, st) -> None:
    """What the first fit of any process pays (lazy imports on the first optimizer step),
    paid before the clock starts: a rerun would otherwise pay it in its first computed round."""
    model = torch.nn.Linear(2, 1)
    trainer = st.Trainer(
        loss=torch.nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    trainer.fit(model, [(torch.randn(4, 2), torch.randn(4, 1))])


def federated_child(keeper: str, out: str) -> None:
    """The loop a child process runs; prints ``round R END WALL CPU`` as each round ends."""
    torch, _, st, Graph, Mlp = _modules()
    from somatize import DiskKeeper

    torch.set_num_threads(1)
    _warm_up(torch, st)
    client = st.remember(train_client, keeper=DiskKeeper(keeper))
    shards = [batches(100 + c, 16) for c in range(CLIENTS)]
    torch.manual_seed(0)
    state = st.state(Graph.somatize(Mlp()))
    wall, cpu = time.perf_counter(), time.process_time()
    for r in range(1, ROUNDS + 1):
        results = [client(state, shards[c], r) for c in range(CLIENTS)]
        state = st.fedavg(results)
        recalled = sum(x.recalled for x in results)
        print(
            f"round {r} {time.perf_counter() - wall:.6f} {time.process_time() - cpu:.6f} {recalled}",
            flush=True,
        )
    torch.save(dict(state), out)


def _child(
    keeper: Path, out: Path, kill_after: int | None
) -> tuple[list[tuple[float, float, int]], float]:
    """Run the loop in a child; SIGKILL it once round ``kill_after`` has ended. Returns each
    round's (wall, cpu, recalled) since the loop started, and the child's whole wall time."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--federated-child", str(keeper), str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    rounds = []
    assert proc.stdout is not None
    for line in proc.stdout:
        _, r, wall, cpu, recalled = line.split()
        rounds.append((float(wall), float(cpu), int(recalled)))
        if kill_after is not None and int(r) == kill_after:
            proc.send_signal(signal.SIGKILL)  # now, in round kill_after + 1
            break
    proc.stdout.close()
    code = proc.wait()
    if code not in (0, -signal.SIGKILL):
        raise RuntimeError(f"the federated child exited with {code}")
    return rounds, time.perf_counter() - start


def _campaign(st, keeper_dir: str, data: list) -> tuple[float, float, list]:
    from somatize import DiskKeeper

    train = st.remember(train_seed, keeper=DiskKeeper(keeper_dir))
    wall, cpu = time.perf_counter(), time.process_time()
    results = [train(seed, data) for seed in range(5)]
    return time.perf_counter() - wall, time.process_time() - cpu, results


def run(quick: bool) -> list[Row]:
    torch, _, st, _, _ = _modules()

    torch.set_num_threads(1)
    _warm_up(torch, st)
    root = Path(tempfile.mkdtemp(prefix="somatize-bench-remember-"))
    data = batches(0, 4 if quick else 12)
    trials = 2 if quick else 3
    first, rerun, plain = [], [], []
    for t in range(trials):  # interleaved: plain, first, rerun, plain, first, rerun...
        wall, cpu = time.perf_counter(), time.process_time()
        for seed in range(5):
            train_seed(seed, data)
        plain.append((time.perf_counter() - wall, time.process_time() - cpu))
        keeper = str(root / f"campaign-{t}")
        w, c, firsts = _campaign(st, keeper, data)
        first.append((w, c))
        w, c, again = _campaign(st, keeper, data)
        rerun.append((w, c))
        assert not any(r.recalled for r in firsts) and all(r.recalled for r in again)
    med = {
        name: tuple(statistics.median(x[i] for x in s) for i in (0, 1))
        for name, s in (("first", first), ("rerun", rerun), ("plain", plain))
    }
    ratio = med["rerun"][0] / med["first"][0]
    rows = [
        Row(
            "remember",
            "rerun of a finished 5-seed campaign (all recalled)",
            med["rerun"][0] * 1e3,
            "ms",
            baseline="its first run",
            baseline_value=med["first"][0] * 1e3,
            ratio=ratio,
            target="≤ 5%",
            met=ratio <= 0.05,
            note=f"{ratio:.1%} of the first run; CPU {med['rerun'][1] * 1e3:.1f} ms vs "
            f"{med['first'][1] * 1e3:.0f} ms",
        ),
        Row(
            "remember",
            "first run of the campaign, remembered (keys, stores, records)",
            med["first"][0] * 1e3,
            "ms",
            baseline="the same calls, not remembered",
            baseline_value=med["plain"][0] * 1e3,
            ratio=med["first"][0] / med["plain"][0],
            note=f"CPU {med['first'][1] * 1e3:.0f} ms vs {med['plain'][1] * 1e3:.0f} ms",
        ),
    ]

    fed_trials = 1 if quick else 2
    missing, missing_cpu, extra, extra_cpu, whole, equal = [], [], [], [], [], True
    for t in range(fed_trials):
        ref_rounds, _ = _child(root / f"fed-ref-{t}", root / f"ref-{t}.pt", None)
        killed, _ = _child(root / f"fed-{t}", root / f"killed-{t}.pt", KILL_AFTER)
        again, child_wall = _child(root / f"fed-{t}", root / f"again-{t}.pt", None)
        missing.append(ref_rounds[-1][0] - ref_rounds[KILL_AFTER - 1][0])
        missing_cpu.append(ref_rounds[-1][1] - ref_rounds[KILL_AFTER - 1][1])
        extra.append(again[-1][0])
        extra_cpu.append(again[-1][1])
        whole.append(child_wall)
        assert (
            len(killed) == KILL_AFTER
            and sum(r[2] for r in again[:KILL_AFTER]) == KILL_AFTER * CLIENTS
        )
        a = torch.load(root / f"ref-{t}.pt", weights_only=True)
        b = torch.load(root / f"again-{t}.pt", weights_only=True)
        equal = equal and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    m, e = statistics.median(missing), statistics.median(extra)
    rows.append(
        Row(
            "remember",
            f"federated loop SIGKILLed after round {KILL_AFTER} of {ROUNDS}, rerun "
            f"({CLIENTS} clients; final state {'torch.equal' if equal else 'DIFFERENT'})",
            e * 1e3,
            "ms",
            baseline=f"rounds {KILL_AFTER + 1}–{ROUNDS} uninterrupted",
            baseline_value=m * 1e3,
            ratio=e / m,
            target="≤ 1.2×, torch.equal",
            met=e / m <= 1.2 and equal,
            note=f"CPU {statistics.median(extra_cpu) * 1e3:.0f} ms vs "
            f"{statistics.median(missing_cpu) * 1e3:.0f} ms; the rerun process with interpreter "
            f"and imports: {statistics.median(whole):.1f} s",
        )
    )
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--federated-child"]:
        federated_child(sys.argv[2], sys.argv[3])
    else:
        from run import table

        print(table(run("--quick" in sys.argv)))
