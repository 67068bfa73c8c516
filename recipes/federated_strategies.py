"""Federated strategies side by side on Dirichlet(0.5) digits: 100 clients, 10% per round.

    python recipes/federated_strategies.py                     # 40 rounds, every strategy: ~4 min
    python recipes/federated_strategies.py --rounds 10 --only fedavg fedprox fedadam  # ~40 s
    python recipes/federated_strategies.py --rounds 10 --only fedavg fedprox fedadam --seeds 3
    tensorboard --logdir runs/federated_strategies             # a run per strategy and seed

Digits split over 100 clients with Dirichlet(α = 0.5) label skew (Hsu et al. 2019);
each round samples 10 clients (``fl.sample``, deterministic in seed and round), each
trains two local epochs of SGD from the global state, and the server combines them:

* FedAvg — ``st.fedavg``;  FedProx — the same with ``fl.prox`` (μ = 1) on the client;
* FedAvgM, FedAdam, FedYogi, FedAdagrad — ``server.step(global, fedavg)`` (Reddi et al. 2021);
* SCAFFOLD — ``fl.scaffold`` control variates (Karimireddy et al. 2020);
* the coordinate-wise median and multi-Krum — robust rules, the price they pay without attackers.

Test accuracy goes to TensorBoard every round, and a table ends the run. With
``--seeds N`` each strategy runs on seeds ``seed … seed+N-1`` — each seed its own train/test
split, partition, client sample and initial weights, the same for every strategy — and
the table gives each strategy's mean ± std over the seeds and, seed by seed, its
difference from the first strategy listed (a paired comparison: the seed's luck is the
same on both sides, so the differences vary far less than the accuracies do). TensorBoard
gets ``<strategy>/seed<s>`` for each seed and ``<strategy>/mean``, the per-round mean.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import require
from somatize.torch import federated as fl

LR, EPOCHS, BATCH = 0.2, 2, 10


class Dense(Node):
    def __init__(self, inputs: int, outputs: int, relu: bool = True) -> None:
        self.lin, self.relu = nn.Linear(inputs, outputs), relu

    def forward(self, x: torch.Tensor, ctx: Any) -> Done:
        h = self.lin(x)  # (batch, outputs)
        return Done(Opaque(torch.relu(h) if self.relu else h))


def make_graph(seed: int = 0) -> Graph:
    torch.manual_seed(seed)
    return Graph.somatize(Dense(64, 64) >> Dense(64, 10, relu=False))


def load(
    seed: int = 0,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    require("sklearn", "recipes")  # else an error naming the extra to install
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xa, xb, ya, yb = train_test_split(x / 16.0, y, test_size=0.25, random_state=seed, stratify=y)
    t = torch.tensor
    return (t(xa, dtype=torch.float32), t(ya)), (t(xb, dtype=torch.float32), t(yb))


def local(g: Graph, x: torch.Tensor, y: torch.Tensor, seed: int, optimizer: Any) -> st.TrainResult:
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=optimizer,
        epochs=EPOCHS,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, list(zip(x.split(BATCH), y.split(BATCH))))


def sgd(ps: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(ps, lr=LR)


def client(global_state: dict[str, Any], x: Any, y: Any, seed: int, mu: float = 0.0) -> Any:
    g = make_graph()
    st.load_state(g, global_state)
    return local(g, x, y, seed, fl.prox(sgd, mu) if mu else sgd)


Server = Callable[[dict[str, torch.Tensor], list[st.TrainResult]], dict[str, torch.Tensor]]


def servers() -> dict[str, Server | None]:
    """Each strategy's server rule (None: SCAFFOLD, whose loop keeps control variates)."""

    def optimizer(opt: fl.ServerOptimizer) -> Server:
        return lambda g, results: opt.step(g, st.fedavg(results))

    return {
        "fedavg": lambda g, results: dict(st.fedavg(results)),
        "fedprox": lambda g, results: dict(st.fedavg(results)),
        "fedavgm": optimizer(fl.FedAvgM(lr=1.0, momentum=0.9)),
        "fedadam": optimizer(fl.FedAdam(lr=0.01, tau=1e-3)),
        "fedyogi": optimizer(fl.FedYogi(lr=0.01, tau=1e-3)),
        "fedadagrad": optimizer(fl.FedAdagrad(lr=0.03, tau=1e-3)),
        "scaffold": None,
        "fedmedian": lambda g, results: dict(st.fedmedian(results)),
        "multikrum": lambda g, results: dict(fl.multi_krum(results, attackers=1, keep=6)),
    }


def run(name: str, rounds: int, log_dir: Path | None, seed: int = 0) -> list[float]:
    """One strategy for ``rounds`` rounds; test accuracy after each."""
    (x, y), (tx, ty) = load(seed)
    parts = fl.dirichlet(y, clients=100, alpha=0.5, seed=seed, min_size=2)
    server = servers()[name]
    g = make_graph(seed)  # the seed's initial weights: a seed is a whole replicate
    state, c = st.state(g), fl.variates(g)
    c_clients: dict[int, dict[str, torch.Tensor]] = {}
    writer = None
    if log_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        # (purge_step=1: a rerun draws its rounds over the earlier run's, not beside them)
        writer = SummaryWriter(str(log_dir / name / f"seed{seed}"), purge_step=1)
    curve = []
    for r in range(rounds):
        chosen = fl.sample(len(parts), fraction=0.1, round=r, seed=seed)
        if name == "scaffold":
            results, deltas = [], []
            for k in chosen:
                ck = c_clients.get(k) or {n: torch.zeros_like(v) for n, v in c.items()}
                local_g = make_graph()
                st.load_state(local_g, state)
                res = local(
                    local_g,
                    x[parts[k]],
                    y[parts[k]],
                    r * 1000 + k,
                    fl.scaffold(sgd, local_g, c, ck),
                )
                c_clients[k] = fl.control_variate(state, res, c, ck, lr=LR)
                deltas.append({n: c_clients[k][n] - ck[n] for n in c})
                results.append(res)
            state, c = dict(st.fedavg(results)), fl.server_variate(c, deltas, clients=len(parts))
        else:
            mu = 1.0 if name == "fedprox" else 0.0
            results = [client(state, x[parts[k]], y[parts[k]], r * 1000 + k, mu) for k in chosen]
            assert server is not None
            state = server(state, results)
        m = st.module(g)
        st.load_state(g, state)
        with torch.no_grad():
            curve.append(float(st.accuracy(m.eval()(tx), ty)))
        if writer is not None:
            writer.add_scalar("test/acc", curve[-1], r + 1)
            writer.add_scalar(
                "train/loss",
                fl.weighted_metrics(
                    [(res.num_examples, {"loss": res.losses[-1]}) for res in results]
                )["loss"],
                r + 1,
            )
    if writer is not None:
        writer.close()
    return curve


def table(curves: dict[str, list[float]], reach: float = 0.8) -> str:
    lines = [f"{'strategy':<11} {'final':>6} {'best':>6} {'rounds to ' + format(reach, '.0%'):>15}"]
    for name, curve in curves.items():
        hit = next((i + 1 for i, a in enumerate(curve) if a >= reach), None)
        lines.append(f"{name:<11} {curve[-1]:>6.3f} {max(curve):>6.3f} {hit or '—':>15}")
    return "\n".join(lines)


def seeds_table(runs: dict[str, list[list[float]]], reach: float = 0.8) -> str:
    """Each strategy over its seeds (``runs[name][i]``: seed i's curve), the first as baseline.

    ``final``: mean ± std over the seeds (``st.compare``); ``best``: the mean of each seed's
    best round; ``rounds to``: the mean over the seeds that reached it (how many, if not
    all); ``Δ final``: the mean ± std over seeds of (this strategy − the first strategy) on
    the same seed, and how many seeds it came out ahead on.
    """
    c = st.compare({name: [curve[-1] for curve in curves] for name, curves in runs.items()}, "acc")
    first, *_ = runs
    base = [curve[-1] for curve in runs[first]]
    n = len(base)
    reach_head = "rounds to " + format(reach, ".0%")
    lines = [
        f"{'strategy':<11} {'final (' + str(n) + ' seeds)':>17} {'best':>6} "
        f"{reach_head:>15}  Δ final vs {first}, paired"
    ]
    for name, curves in runs.items():
        s = c.summaries[name]
        hits = [next((i + 1 for i, a in enumerate(cv) if a >= reach), None) for cv in curves]
        reached = [h for h in hits if h is not None]
        hit = f"{statistics.mean(reached):.1f}" if reached else "—"
        hit += f" ({len(reached)}/{n})" if reached and len(reached) < n else ""
        diffs = [cv[-1] - b for cv, b in zip(curves, base)]
        spread = statistics.stdev(diffs) if n > 1 else 0.0
        ahead = sum(d > 0 for d in diffs)
        delta = (
            "—"
            if name == first
            else f"{statistics.mean(diffs):+.3f} ± {spread:.3f} (ahead on {ahead}/{n})"
        )
        best = statistics.mean(max(cv) for cv in curves)
        lines.append(
            f"{name:<11} {f'{s.mean:.3f} ± {s.std:.3f}':>17} {best:>6.3f} {hit:>15}  {delta}"
        )
    return "\n".join(lines)


def log_mean(log_dir: Path, name: str, curves: list[list[float]]) -> None:
    """``<name>/mean``: the per-round mean over the seeds (TensorBoard does not average runs)."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(log_dir / name / "mean"), purge_step=1) as writer:
        for r, accs in enumerate(zip(*curves)):
            writer.add_scalar("test/acc", statistics.mean(accs), r + 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--only", nargs="*", choices=list(servers()), help="these strategies")
    parser.add_argument("--logdir", default="runs/federated_strategies")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument(
        "--seeds", type=int, default=1, help="how many seeds: seed, seed+1, ... (each a replicate)"
    )
    a = parser.parse_args(argv)
    if a.seeds < 1:
        parser.error(f"--seeds must be at least 1, not {a.seeds}")
    (_, y), _ = load(a.seed)
    print(fl.histogram(y, fl.dirichlet(y, clients=100, alpha=0.5, seed=a.seed, min_size=2)))
    seeds = range(a.seed, a.seed + a.seeds)
    runs: dict[str, list[list[float]]] = {}
    for name in a.only or list(servers()):
        runs[name] = []
        for seed in seeds:
            runs[name].append(run(name, a.rounds, Path(a.logdir), seed))
            print(
                f"{name:<11} seed {seed} round {a.rounds}: test accuracy {runs[name][-1][-1]:.3f}",
                flush=True,
            )
        if a.seeds > 1:
            log_mean(Path(a.logdir), name, runs[name])
    if a.seeds == 1:
        print("\n" + table({name: curves[0] for name, curves in runs.items()}))
    else:
        print("\n" + seeds_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
