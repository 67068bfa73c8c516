"""A sweep of heads on a process pool, sharing a frozen backbone cached per example in one
DiskKeeper (docs/caching.md, "A sweep, or federated clients, sharing the cache"): each
configuration's result is the one it gets run in this process with caching off; the
backbone computes each example at most once per worker process, and not at all in the runs
that start after one has finished; the store is intact afterwards."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque
from somatize.cli import main as somatize_main

N_TRAIN, N_VAL, EPOCHS, WORKERS = 160, 40, 3, 2


class Backbone(Node):
    """A frozen MLP (our "pretrained" one). Given ``log``, a directory, it appends the
    examples it computes (column 0 is their index) to a file of this process's own, with
    the time: what ran where, counted by the backbone itself, not by the cache."""

    def __init__(self, log: str | None = None) -> None:
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
        self.log = log

    def forward(self, x, ctx):
        if self.log is not None:
            rows = " ".join(str(i) for i in x[:, 0].long().tolist())
            with open(os.path.join(self.log, f"{os.getpid()}.log"), "a") as f:
                f.write(f"{time.time()!r} {rows}\n")
        return Done(Opaque(self.net(x)))


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(16, 4)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


@dataclass(frozen=True)
class Config:
    lr: float
    weight_decay: float
    seed: int
    cache: str | None = None  # the DiskKeeper's directory; None: caching off
    log: str | None = None  # where the backbone logs what it computes


def examples(start: int, n: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(start)
    x = torch.randn(n, 8, generator=gen)
    x[:, 0] = torch.arange(start, start + n, dtype=torch.float32)  # the example's index
    return TensorDataset(x, torch.randint(0, 4, (n,), generator=gen))


def train(config: Config) -> st.TrainResult:
    """One configuration of the sweep, as a user writes it: module-level, so the pool can
    ship it; the graph is built here, in the worker, around the same backbone weights."""
    torch.manual_seed(0)  # the same "pretrained" weights in every run: the same keys
    backbone = Backbone(config.log).with_id("enc")
    torch.manual_seed(config.seed)  # this configuration's fresh head
    keeper = DiskKeeper(config.cache) if config.cache else None
    g = Graph.somatize(backbone >> Head().with_id("head"), keeper=keeper)
    g.freeze("enc")
    if config.cache:
        g.cache("enc", per="example")
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=config.lr, weight_decay=config.weight_decay),
        epochs=EPOCHS,
        metrics={"acc": st.accuracy},
        seed=config.seed,  # the shuffle
        options=st.Options(progress=False),
    )
    return trainer.fit(
        g,
        DataLoader(examples(0, N_TRAIN), batch_size=16, shuffle=True),
        val=DataLoader(examples(N_TRAIN, N_VAL), batch_size=16),
    )


@dataclass(frozen=True)
class Ran:
    start: float
    end: float
    pid: int
    threads: int  # torch's intra-op threads in the worker
    result: st.TrainResult


def timed(config: Config, meet: threading.Barrier) -> Ran:
    """``train``, with when and where it ran. The first ``WORKERS`` configurations start
    together (at ``meet``, a barrier: each is running before either ends), so that the
    workers fill the cold cache at once."""
    start = time.time()
    if config.seed < WORKERS:
        meet.wait(timeout=60)
    result = train(config)
    return Ran(start, time.time(), os.getpid(), torch.get_num_threads(), result)


def computed(log: Path) -> dict[int, list[tuple[float, list[int]]]]:
    """Per worker process, each call of the backbone: its time and the examples it computed."""
    calls: dict[int, list[tuple[float, list[int]]]] = {}
    for file in log.glob("*.log"):
        for line in file.read_text().splitlines():
            when, *rows = line.split()
            calls.setdefault(int(file.stem), []).append((float(when), [int(r) for r in rows]))
    return calls


@pytest.mark.slow
def test_a_sweep_on_the_pool_shares_the_backbone_cached_per_example(tmp_path, capsys):
    cache, log = tmp_path / "cache", tmp_path / "log"
    log.mkdir()
    grid = [(3e-2, 0.0), (1e-2, 0.0), (3e-2, 1e-2), (1e-2, 1e-2), (3e-3, 0.0)]
    configs = [
        Config(lr, wd, seed, cache=str(cache), log=str(log)) for seed, (lr, wd) in enumerate(grid)
    ]
    children = set(multiprocessing.active_children())
    with multiprocessing.Manager() as manager, st.executor(workers=WORKERS) as pool:
        meet = manager.Barrier(WORKERS)
        ran = list(pool.map(timed, configs, [meet] * len(configs)))
    assert set(multiprocessing.active_children()) <= children  # the workers are gone
    runs = [r.result for r in ran]
    assert {r.threads for r in ran} == {1}  # st.executor's workers: one torch thread each

    # (a) each configuration's result is the one it gets here, in series, caching off
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run
    try:
        plain = [train(Config(c.lr, c.weight_decay, c.seed)) for c in configs]
    finally:
        torch.set_num_threads(before)
    for c, p in zip(runs, plain):
        # allclose, not equal: a cached row was computed in another batch (another run's,
        # an evaluation's, or among a batch's other misses), of another size, and a
        # matmul's last bits may depend on the batch's size
        for name in ("head.out.weight", "head.out.bias"):
            torch.testing.assert_close(c.state[name], p.state[name], rtol=1e-5, atol=1e-6)
        assert len(c.metrics) == len(p.metrics) == EPOCHS
        for mc, mp in zip(c.metrics, p.metrics):
            assert mc["val_loss"] == pytest.approx(mp["val_loss"], rel=1e-5)
            assert mc["val_acc"] == pytest.approx(mp["val_acc"], abs=1e-6)
        assert c.cache["enc"]["hits"] + c.cache["enc"]["misses"] == EPOCHS * N_TRAIN

    # (b) what the backbone computed, counted by itself. Guaranteed: a worker computes an
    # example at most once (it finds what it stored itself: in its read cache, then on disk
    # for its next run); workers filling the cold cache at once may each compute it (each
    # may miss a row before the other's pack lands, or before its handle relists packs/),
    # so at most once per worker of the first wave; and a run started after another ended
    # finds every row on disk (a fresh DiskKeeper lists every pack), computing none.
    calls = computed(log)
    assert 0 < len(calls) <= WORKERS
    for pid, made in calls.items():
        counts = Counter(i for _, rows in made for i in rows)
        assert max(counts.values()) == 1, f"worker {pid} computed an example twice"
    total = Counter(i for made in calls.values() for _, rows in made for i in rows)
    assert set(total) == set(range(N_TRAIN + N_VAL))  # every example, training and validation
    first_end = min(r.end for r in ran)
    first_wave = [r for r in ran if r.start < first_end]
    assert first_wave == ran[:WORKERS]  # (they met at the barrier; the others waited a worker)
    assert max(total.values()) <= len(first_wave)
    for r in ran:
        during = [rows for when, rows in calls.get(r.pid, []) if r.start <= when <= r.end]
        trained = sum(1 for rows in during for i in rows if i < N_TRAIN)
        assert r.result.cache["enc"]["misses"] == trained  # the cache's count agrees
        if r.start >= first_end:
            assert during == [], "a run after the first wave computed rows"

    # (c) the store is intact: no damaged entry, checksums and decoding
    keeper = DiskKeeper(cache)
    assert keeper.verify() == []
    assert keeper.stats().entries == N_TRAIN + N_VAL
    assert somatize_main(["cache", "verify", "--dir", str(cache)]) == 0
    assert "0 corrupt entries removed" in capsys.readouterr().out
