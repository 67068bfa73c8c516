"""Remembered runs on st.executor and on a Dask cluster sharing the keeper's directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def train_seed(seed: int) -> st.TrainResult:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    batches = [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(4)
    ]
    torch.manual_seed(seed)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=3,
        checkpoint=st.run_checkpointing(every_steps=4),
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(Graph.somatize(Linear()), batches, resume="last")


def same(a: st.TrainResult, b: st.TrainResult) -> bool:
    return a.losses == b.losses and all(torch.equal(a.state[k], b.state[k]) for k in a.state)


@pytest.mark.slow
def test_runs_on_the_process_pool_and_on_dask_are_computed_once_then_recalled(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    train = st.remember(train_seed, keeper=DiskKeeper(tmp_path / "runs"))
    before = torch.get_num_threads()
    try:
        serial = [train_seed(seed) for seed in range(3)]  # plain calls: the reference
    finally:
        torch.set_num_threads(before)

    with st.executor(workers=2) as pool:
        first = list(pool.map(train, [0, 1, 0, 1]))  # each seed asked twice, maybe at once
    assert sum(r.recalled for r in first) == 2  # one computed, the other waited and recalled
    assert all(same(r, serial[i % 2]) for i, r in enumerate(first))

    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",  # a free port: other clusters may hold 8787
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        again = list(client.get_executor().map(train, [0, 1, 2]))
    assert [r.recalled for r in again] == [True, True, False]
    assert all(same(r, serial[i]) for i, r in enumerate(again))
    assert train(2).recalled  # and the parent sees what the cluster computed


@pytest.mark.slow
def test_the_campaign_recipe_remembers_its_seeds_on_the_pool(tmp_path):
    from recipes import campaign

    results = campaign.campaign(seeds=2, workers=2, epochs=3, out=str(tmp_path))
    assert [r.seed for r in results] == [0, 1]
    assert all(r.epochs == 3 and r.metric("val_acc") > 0.5 for r in results)
    assert results[0].state.keys() == results[1].state.keys()
    assert not all(torch.equal(results[0].state[k], results[1].state[k]) for k in results[0].state)
    assert not any(r.recalled for r in results)
    summary = st.summarize(results, "val_acc")
    assert summary.n == 2 and summary.min == min(r.metric("val_acc") for r in results)
    train = st.remember(campaign.run_seed, keeper=DiskKeeper(tmp_path), exclude=("logs",))
    again = train(1, 3, str(tmp_path))  # what the workers trained, the parent recalls
    assert again.recalled and again.key == results[1].key
    assert st.Checkpointing(Path(again.checkpoint).parent).last() is not None  # under its key


def client(global_state: dict[str, torch.Tensor], task: tuple[torch.Tensor, torch.Tensor, int]):
    """A federated client as ``fl.map_clients`` calls it: ``fn(shared, task)``."""
    x, y, seed = task
    torch.manual_seed(0)
    g = Graph.somatize(Linear())
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=1,
        seed=seed,
        checkpoint=st.run_checkpointing(),
        options=st.Options(progress=False),
    )
    return trainer.fit(g, list(zip(x.split(4), y.split(4))), resume="last")


def federate(fn, pool, server=None, rounds=2):
    """Three clients a round; FedAvg, or ``server.step`` on FedAvg's aggregate."""
    from somatize.torch import federated as fl

    gen = torch.Generator().manual_seed(3)
    data = [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(3)
    ]
    torch.manual_seed(0)
    state, recalled = st.state(Graph.somatize(Linear())), []
    for r in range(rounds):
        tasks = [(x, y, 100 * r + c) for c, (x, y) in enumerate(data)]
        results = fl.map_clients(pool, fn, tasks, shared=state)
        recalled.append(sum(getattr(res, "recalled", False) for res in results))
        agg = st.fedavg(results)
        state = server.step(state, agg) if server else dict(agg)
    return state, recalled


@pytest.mark.slow
def test_a_remembered_client_on_map_clients_is_recalled_on_the_pool_and_in_series(tmp_path):
    """docs/federated.md, resuming on a pool: the keys are the same on the pool and here,
    the rerun recalls every client, and a strategy whose first round asks the same
    clients the same thing (FedAdam's round 1 is FedAvg's) recalls that round."""
    from somatize.torch import federated as fl

    remembered = st.remember(client, keeper=DiskKeeper(tmp_path / "runs"))
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pool's workers run
    try:
        plain, _ = federate(client, None)
        with st.executor(workers=2) as pool:
            first, computed = federate(remembered, pool)
            rerun, recalled = federate(remembered, pool)
        serial, recalled_here = federate(remembered, None)
        adam, adam_recalled = federate(remembered, None, server=fl.FedAdam(lr=1e-2))
    finally:
        torch.set_num_threads(before)
    assert computed == [0, 0] and recalled == [3, 3] and recalled_here == [3, 3]
    for state in (first, rerun, serial):
        assert all(torch.equal(state[k], plain[k]) for k in plain)
    assert adam_recalled == [3, 0]  # round 1 is FedAvg's; FedAdam's global state differs after
    assert not all(torch.equal(adam[k], plain[k]) for k in plain)
