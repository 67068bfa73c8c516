"""LightningGraph under Lightning's DDP, launched by ``tests/torch/test_lightning_ddp.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/lightning_ddp.py OUT_DIR [PHASE...]

Fits, one after another in the same two processes (gloo, CPU), by phase (all by default):

* ``rare``: a graph with a node that reports a metric only for a batch holding an
  outlier — only rank 1's share of the validation set holds one; then ``st.Trainer`` on
  the same graph and data;
* ``cache``: a frozen encoder cached per example, three epochs;
* ``resume``: ``part`` (2 epochs, checkpointed), ``resume`` (to 4 from its ``last.ckpt``)
  and ``full`` (4 epochs straight);
* ``pad``: 29 validation rows, through the ``DistributedSampler`` Lightning puts in
  (``padded``) and through ``UnrepeatedDistributedSampler`` (``unrepeated``).

Every rank writes what it got to OUT_DIR/rank<R>.pt, with the warnings that advised
``sync_dist=True``. A fit that hangs (each rank waiting in another collective) is ended
by faulthandler, its stacks printed, after 120 seconds.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import sys
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

X = torch.randn(160, 8, generator=torch.Generator().manual_seed(0))
Y = X[:, :3].argmax(dim=1)
TRAIN, VAL = slice(0, 32), slice(128, 160)  # 16 validation rows a rank: one batch each
OUTLIER = 1.8  # only row 129 + 2k (rank 1's share) has x[0] above it


class Flag(Node):
    """Reports ``outliers`` only for a batch that has one (a data-dependent metric)."""

    def forward(self, x, ctx):
        n = int((x[:, 0] > OUTLIER).sum())
        return Done(x, metrics={"outliers": float(n)} if n else {})


class Enc(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(8, 16)

    def forward(self, x, ctx):
        return Done(Opaque(torch.tanh(self.lin(x))))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.lin(h)))


def graph(flag: bool = False, cached: bool = False) -> Graph:
    torch.manual_seed(0)
    enc = Enc().with_id("enc")
    g = Graph.somatize(Flag() >> enc >> Head() if flag else enc >> Head())
    return g.freeze("enc").cache("enc", per="example") if cached else g


def loader(rows: slice, **kw) -> DataLoader:
    return DataLoader(TensorDataset(X[rows], Y[rows]), batch_size=16, **kw)


def fit(out: Path, g: Graph, epochs: int, train, val, **kw):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from somatize.torch.lightning import LightningGraph, result

    class Epochs(L.Callback):  # each epoch's cache counts, this rank's (EpochEnd.cache)
        def __init__(self) -> None:
            self.counts: list = []

        def on_train_epoch_end(self, trainer, lg):
            self.counts.append(lg.epoch_cache())

    faulthandler.dump_traceback_later(120, exit=True)
    L.seed_everything(0, verbose=False)
    lg = LightningGraph(
        g,
        loss=kw.pop("loss", F.cross_entropy),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
    )
    save = kw.pop("save", None)
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=save is not None,
        callbacks=[
            epochs_ := Epochs(),
            *([ModelCheckpoint(out / save, save_last=True)] if save else []),
        ],
    )
    trainer.fit(lg, train, val, **kw)
    faulthandler.cancel_dump_traceback_later()
    r = result(trainer, lg)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return {"history": lg.history, "losses": lg.losses, "epoch_losses": r.epoch_losses,
            "terms": r.terms, "epoch_terms": r.epoch_terms,
            "cache": dict(r.cache), "epochs": epochs_.counts, "val_examples": r.val_examples,
            "logged": logged, "state": dict(r.state), "lg": lg}  # fmt: skip


def two_terms(out, y):
    ce = F.cross_entropy(out, y)
    return {"loss": ce + 0.01 * out.pow(2).mean(), "ce": ce, "rank": float(os.environ["RANK"])}


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    phases = sys.argv[2:] or ["rare", "cache", "resume", "pad", "terms"]
    rank = int(os.environ["RANK"])
    got: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if "rare" in phases:
            got["rare"] = fit(out, graph(flag=True), 3, loader(TRAIN), loader(VAL))
            trainer = st.Trainer(  # (in the process group Lightning made: it stays)
                loss=F.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
                epochs=3,
                options=st.Options(progress=False, shuffle=False),
            )
            done = trainer.fit(graph(flag=True), loader(TRAIN), val=loader(VAL))
            got["st"] = {"history": done.metrics}
        if "cache" in phases:
            got["cache"] = fit(out, graph(cached=True), 3, loader(TRAIN), loader(VAL))
        if "resume" in phases:
            shuffled = functools.partial(loader, TRAIN, shuffle=True)
            got["part"] = fit(out, graph(), 2, shuffled(), loader(VAL), save="ckpt")
            got["resume"] = fit(out, graph(), 4, shuffled(), loader(VAL), save="ckpt", ckpt_path="last")  # fmt: skip
            got["full"] = fit(out, graph(), 4, shuffled(), loader(VAL))
        if "pad" in phases:
            rows = slice(128, 157)  # 29 rows: 15 and 14 a rank, or 15 and 14 + 1 repeated
            got["padded"] = fit(out, graph(), 1, loader(TRAIN), loader(rows))
            from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

            dataset = TensorDataset(X[rows], Y[rows])
            once = UnrepeatedDistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=False)
            got["unrepeated"] = fit(
                out, graph(), 1, loader(TRAIN), DataLoader(dataset, 16, sampler=once)
            )
            lg = got["unrepeated"]["lg"]
            with torch.no_grad():  # the validation loss of the final weights, every row once
                loss = F.cross_entropy(lg.net.eval()(X[rows]), Y[rows])
            got["unrepeated"]["single"] = float(loss)
        if "terms" in phases:  # a loss of several terms (TrainResult.terms, .epoch_terms)
            got["terms"] = fit(out, graph(), 2, loader(TRAIN), loader(VAL), loss=two_terms)
    for run in got.values():
        run.pop("lg", None)
    got["advised"] = [str(w.message) for w in caught if "sync_dist=True" in str(w.message)]
    torch.save(got, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
