"""Federated learning on digits, as a for loop: FedAvg against FedSGD at equal rounds.

    python recipes/federated.py                      # serial, 20 rounds
    python recipes/federated.py --executor process   # clients on st.executor(workers=2)
    python recipes/federated.py --executor dask      # clients on a local Dask cluster

scikit-learn's bundled digits (no download), split over ten clients by label shards
(``fl.shards``: two shards each, sorted by label, so one to four classes a client — the
recipe prints the histogram). A round: every client trains
from the global state with the somatize Trainer, ``fedavg`` averages. FedAvg trains
E local epochs of small batches; FedSGD one full-batch step. At equal rounds FedAvg
ends far ahead — McMahan et al., 2017.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import Any

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import require
from somatize.torch import federated as fl


class Dense(Node):
    """A fully connected layer, with ReLU unless it gives the logits."""

    def __init__(self, inputs: int, outputs: int, relu: bool = True) -> None:
        self.lin, self.relu = nn.Linear(inputs, outputs), relu

    def forward(self, x: torch.Tensor, ctx: Any) -> Done:
        h = self.lin(x)  # (batch, outputs)
        return Done(Opaque(torch.relu(h) if self.relu else h))


def make_graph(seed: int = 0) -> Graph:
    """64 pixels → 64 hidden → 10 logits, initialised from ``seed``."""
    torch.manual_seed(seed)
    return Graph.somatize(Dense(64, 64) >> Dense(64, 10, relu=False))


def load_digits(seed: int = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """(train x, train y), (test x, test y): digits, a stratified 75/25 split."""
    require("sklearn", "recipes")  # else an error naming the extra to install
    from sklearn.datasets import load_digits as load
    from sklearn.model_selection import train_test_split

    x, y = load(return_X_y=True)
    xa, xb, ya, yb = train_test_split(x / 16.0, y, test_size=0.25, random_state=seed, stratify=y)
    t, f = torch.tensor, torch.float32
    return (t(xa, dtype=f), t(ya)), (t(xb, dtype=f), t(yb))


def train_client(global_state: dict[str, torch.Tensor], task: tuple[Any, ...]) -> st.TrainResult:
    """One client: from the global state, E epochs of SGD (E = 0: one full-batch step)."""
    x, y, epochs, batch_size, lr, seed = task
    torch.set_num_threads(1)  # many clients share the cores
    g = make_graph()
    st.load_state(g, global_state)
    full = epochs == 0
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
        epochs=None if full else epochs,
        max_steps=1 if full else None,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, [(x, y)] if full else list(zip(x.split(batch_size), y.split(batch_size))))


def accuracy(state: dict[str, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor]) -> float:
    g = make_graph()
    st.load_state(g, state)
    with torch.no_grad():
        return float(st.accuracy(st.module(g).eval()(test[0]), test[1]))


def federate(clients: int = 10, *, rounds: int, local_epochs: int, batch_size: int = 10,
             lr: float = 0.05, seed: int = 0, pool: Executor | None = None
             ) -> tuple[list[float], dict[str, torch.Tensor]]:  # fmt: skip
    """``rounds`` of FedAvg over shard-split digits; test accuracy per round and the final state."""
    (x, y), test = load_digits(seed)
    parts = fl.shards(y, clients=clients, per_client=2, seed=seed)
    global_state = st.state(make_graph(seed))
    curve = []
    for r in range(rounds):  # a federated round is a for loop
        tasks = [(x[p], y[p], local_epochs, batch_size, lr, seed * 10_000 + r * 100 + c)
                 for c, p in enumerate(parts)]  # fmt: skip
        results = fl.map_clients(pool, train_client, tasks, shared=global_state)
        global_state = dict(st.fedavg(results))  # weighted by num_examples, matched by name
        curve.append(accuracy(global_state, test))
    return curve, global_state


@contextlib.contextmanager
def executor(kind: str, workers: int = 2) -> Iterator[Executor | None]:
    """None (serial), ``st.executor`` (process) or a local Dask cluster's executor (dask)."""
    if kind == "serial":
        yield None
    elif kind == "process":
        with st.executor(workers=workers) as pool:
            yield pool
    elif kind == "dask":
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, host="127.0.0.1",
                               dashboard_address=None)  # fmt: skip
        with cluster, Client(cluster) as client:
            yield client.get_executor()
    else:
        raise ValueError(f"unknown executor {kind!r}: use serial, process or dask")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--executor", choices=["serial", "process", "dask"], default="serial")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    (_, y), _ = load_digits(a.seed)
    print(fl.histogram(y, fl.shards(y, clients=a.clients, seed=a.seed)))
    common = {"clients": a.clients, "rounds": a.rounds, "seed": a.seed}
    with executor(a.executor) as pool:
        avg, _ = federate(local_epochs=a.local_epochs, pool=pool, **common)
        sgd, _ = federate(local_epochs=0, pool=pool, **common)
    print(f"\n{'round':>5}  {'FedAvg E=' + str(a.local_epochs):>12}  {'FedSGD':>8}")
    for r, (p, q) in enumerate(zip(avg, sgd), start=1):
        print(f"{r:>5}  {p:>12.3f}  {q:>8.3f}")
    won = avg[-1] > sgd[-1]
    print(f"\nafter {a.rounds} rounds: FedAvg {avg[-1]:.3f} vs FedSGD {sgd[-1]:.3f} — "
          f"{'FedAvg ahead, as McMahan et al. found' if won else 'FedAvg NOT ahead'}")  # fmt: skip
    return 0 if won else 1


if __name__ == "__main__":
    sys.exit(main())
