"""Frozen and cached nodes under Lightning: frozen nodes stay frozen, cached ones keep
caching, and the cache counts are logged, returned and carried through a resume."""

from __future__ import annotations

import collections
import csv
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

import somatize.torch as st  # noqa: E402
from somatize import DiskKeeper, Done, Graph, Node, Recorder  # noqa: E402
from somatize.torch.lightning import Watch, result  # noqa: E402
from somatize.watchers import EpochEnd  # noqa: E402
from tests.torch.lightning_graphs import Out, _lg, _loader, _tensors, _trainer  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    # the nodes count their calls in CALLS, which their keys cannot (and need not) see
    pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS"),
    *QUIET,
    NO_VAL,  # fitting without validation data is a normal run here, as in the Trainer
]


# -- frozen and cached nodes ------------------------------------------------------------

CALLS: collections.Counter[str] = collections.Counter()  # not data: stays out of node keys
MODES: list[bool] = []


class Encoder(Node):
    def __init__(self, i: int, o: int):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        CALLS["encoder"] += 1
        MODES.append(self.lin.training)
        return Done(torch.relu(self.lin(x)))  # data (no grad: the node is frozen), so cacheable


# Frozen nodes are in eval mode at the start of training on purpose; Lightning points it out.
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_frozen_nodes_stay_frozen_and_cached_nodes_keep_caching(tmp_path):
    torch.manual_seed(0)
    g = Graph.somatize(Encoder(8, 16) >> Out(16, 3))
    g.freeze("encoder").cache("encoder")
    lg = _lg(g)
    before = st.state(g)
    CALLS.clear()
    MODES.clear()
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(lg, _loader())
    assert trainer.global_step == 8
    assert CALLS["encoder"] == 4  # 4 distinct batches, computed once each over two epochs
    assert MODES == [False] * 4
    after = st.state(g)
    for k in ("encoder.lin.weight", "encoder.lin.bias"):
        assert torch.equal(after[k], before[k])
    assert not torch.equal(after["out.lin.weight"], before["out.lin.weight"])
    encoder = lg.net.encoder.lin
    assert not any(p.requires_grad for p in encoder.parameters())
    lg.train()
    assert not encoder.training and lg.net.out.lin.training
    assert {id(p) for p in lg.trainer.optimizers[0].param_groups[0]["params"]} == {
        id(p) for p in st.parameters(g)
    }


@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_cache_counts_are_logged_per_epoch_and_given_in_the_result(tmp_path):
    torch.manual_seed(0)
    g = Graph.somatize(Encoder(8, 16) >> Out(16, 3))
    g.freeze("encoder").cache("encoder", per="example")
    lg = _lg(g)
    logger = CSVLogger(str(tmp_path), name="csv", version=0)
    recorder = Recorder()  # somatize watchers through Watch see the same counts
    trainer = _trainer(tmp_path, max_epochs=3, logger=logger, callbacks=[Watch([recorder])])
    trainer.fit(lg, DataLoader(TensorDataset(*_tensors()), batch_size=16, shuffle=True),
                _loader(seed=1))  # fmt: skip
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rates = [float(r["cache/encoder/hit_rate"]) for r in csv.DictReader(f)
                 if r.get("cache/encoder/hit_rate")]  # fmt: skip
    assert rates == [0.0, 1.0, 1.0]  # one per epoch
    assert [e.cache for e in recorder.of(EpochEnd)] == [
        {"encoder": {"hits": 0, "misses": 64}},
        {"encoder": {"hits": 64, "misses": 0}},
        {"encoder": {"hits": 64, "misses": 0}},
    ]
    # 64 training rows: computed once, found twice; the validation rows are not counted
    assert result(trainer, lg).cache == {"encoder": {"hits": 128, "misses": 64}}
    assert g.watchers == []  # the tally was the fit's own


# ckpt_path="last" looks in the ModelCheckpoint's directory, which the first run filled.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_cache_counts_of_a_resumed_run_are_the_whole_runs(tmp_path):
    class Plain(Node):  # (Encoder reads module-level data, which enters its key)
        def __init__(self) -> None:
            self.lin = nn.Linear(8, 16)

        def forward(self, x, ctx):
            return Done(torch.relu(self.lin(x)))

    def run(epochs: int, **kw):
        torch.manual_seed(0)  # the same weights: a new graph over the same disk keeper hits
        enc = Plain().with_id("encoder")
        g = Graph.somatize(enc >> Out(16, 3), keeper=DiskKeeper(tmp_path / "keep"))
        g.freeze("encoder").cache("encoder", per="example")
        lg = _lg(g)
        save = ModelCheckpoint(tmp_path / "ckpt", save_last=True)
        trainer = _trainer(tmp_path, max_epochs=epochs, callbacks=[save])
        data = DataLoader(TensorDataset(*_tensors()), batch_size=16, shuffle=True)
        trainer.fit(lg, data, **kw)
        return trainer, lg

    run(1)  # one epoch: 64 misses, written to the checkpoint
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["somatize"]["cache"][0]["total"] == {"encoder": {"hits": 0, "misses": 64}}
    trainer, lg = run(3, ckpt_path="last")  # two more, with new objects, as a new process
    assert result(trainer, lg).cache == {"encoder": {"hits": 128, "misses": 64}}  # the run's
    old = tmp_path / "old.ckpt"  # a checkpoint from before the counts were kept still resumes
    del saved["somatize"]["cache"]
    torch.save(saved, old)
    trainer, lg = run(2, ckpt_path=str(old))
    assert result(trainer, lg).cache == {"encoder": {"hits": 64, "misses": 0}}  # from the resume


@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_rows_padded_to_each_batchs_longest_are_named_under_lightning_too(tmp_path):
    from tests.torch.test_rows_padding_hint import Padded, graph, hints, shuffled

    lg, recorder = _lg(graph()), Recorder()
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[Watch([recorder])])
    with pytest.warns(RuntimeWarning) as caught:
        trainer.fit(lg, shuffled(Padded()))
    (hint,) = hints(caught)  # the Trainer's tally: said once, at epoch 2, at the fit call
    assert [w.filename for w in caught if "padded to its own longest" in str(w.message)] == [
        __file__
    ]
    second = recorder.of(EpochEnd)[1].cache["enc"]
    assert hint.group(1) == "2" and int(hint.group(4)) == second["hits"]
    assert 0 < second["hits"] < 0.9 * (second["hits"] + second["misses"])
