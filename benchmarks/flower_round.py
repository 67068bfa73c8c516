"""Flower's simulation engine on the rounds of ``bench_federated`` (run by it, in a subprocess).

    python benchmarks/flower_round.py 10,100,1000

Prints one JSON line: Flower's version, its start-up (until the first round, plus
what the first round took beyond a warm one), each round's seconds and the peak
memory of its process tree. The clients run ``bench_federated.train_client`` on
``bench_federated.tasks_for(n)``: the same work as somatize's rounds.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
from bench_federated import _DATA, _state, tasks_for, train_client
from peak_rss import PeakRSS


def run_flower(sizes: list[int]) -> None:
    """Flower's simulation engine on the same clients (in its own process: Ray owns it)."""
    import flwr
    import numpy as np
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    keys = list(_state())
    out: dict[str, Any] = {"rounds": [], "version": flwr.__version__}
    order = [sizes[0], *sizes]  # the first round starts Ray's actors: a warm-up

    class Client(NumPyClient):  # type: ignore[misc]
        def fit(self, parameters: Any, config: Any) -> Any:
            state = {k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, parameters)}
            n, j = int(config["clients"]), int(config["part"])
            if n not in _DATA:
                _DATA[n] = tasks_for(n)
            r = train_client(state, _DATA[n][j])
            return [r.state[k].numpy() for k in keys], r.num_examples, {}

    class Timed(FedAvg):  # type: ignore[misc]
        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            if server_round == 1:
                out["startup"] = time.perf_counter() - begin
            n = order[server_round - 1]
            clients = client_manager.sample(num_clients=n, min_num_clients=n)
            self.n, self.t0 = n, time.perf_counter()
            return [
                (c, FitIns(parameters, {"clients": n, "part": j})) for j, c in enumerate(clients)
            ]

        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            agg = super().aggregate_fit(server_round, results, failures)
            out["rounds"].append((self.n, time.perf_counter() - self.t0))
            if failures:
                out.setdefault("failures", []).append(len(failures))
            return agg

    def server_fn(context: Any) -> Any:
        initial = ndarrays_to_parameters([t.numpy() for t in _state().values()])
        strategy = Timed(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_available_clients=max(sizes),
            initial_parameters=initial,
        )
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=len(order)))

    with PeakRSS() as mem:
        begin = time.perf_counter()
        run_simulation(
            server_app=ServerApp(server_fn=server_fn),
            client_app=ClientApp(client_fn=lambda context: Client().to_client()),
            num_supernodes=max(sizes),
            backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
        )
    out["peak"] = mem.peak
    # start-up: until the first round, plus what the first round took beyond a warm one
    out["startup"] += out["rounds"][0][1] - out["rounds"][1][1]
    out["rounds"] = out["rounds"][1:]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    run_flower([int(n) for n in sys.argv[1].split(",")])
