"""The digits graph under ``lightning.Trainer``, with Lightning's own callbacks and logger.

    python recipes/lightning_callbacks.py                       # 30 epochs at most
    python recipes/lightning_callbacks.py --epochs 5 --out /tmp/digits
    tensorboard --logdir runs/lightning_digits                  # then look at it

scikit-learn's bundled ``load_digits`` (no download), 75% train / 25% validation.
The somatize graph is wrapped in ``LightningGraph`` and trained by Lightning with
``ModelCheckpoint`` (best ``val_acc``, plus ``last.ckpt``), ``EarlyStopping`` on
``val_loss``, ``LearningRateMonitor`` and a ``TensorBoardLogger`` — which also
receives the metric the ``Hidden`` node returns in ``Done`` (``hidden/active``).
``Watch`` forwards the run to a somatize ``JsonLines`` log, and ``result(...)``
turns it into the ``TrainResult`` the rest of somatize (``fedavg``, ``summarize``)
takes. The learning rate follows a cosine to 0 over the run, stepped every optimizer
step. Prints the best validation accuracy and the checkpoint that holds it.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, JsonLines, Node, Opaque
from somatize.errors import require
from somatize.torch.lightning import (  # without lightning: an error naming the extra
    LightningGraph,
    Watch,
    result,
)


class Hidden(Node):
    """A fully connected layer with ReLU; reports the fraction of active units."""

    def __init__(self, inputs: int, outputs: int) -> None:
        self.lin = nn.Linear(inputs, outputs)

    def forward(self, x: torch.Tensor, ctx: Any) -> Done:
        h = torch.relu(self.lin(x))  # (batch, outputs)
        return Done(Opaque(h), metrics={"active": (h > 0).float().mean().detach()})


class Classify(Node):
    """Logits over the ten digits."""

    def __init__(self, inputs: int, classes: int) -> None:
        self.out = nn.Linear(inputs, classes)

    def forward(self, h: torch.Tensor, ctx: Any) -> Done:
        return Done(Opaque(self.out(h)))  # (batch, classes)


def make_graph(seed: int = 0) -> Graph:
    """The model: 64 pixels → 64 hidden → 10 logits, initialised from ``seed``."""
    torch.manual_seed(seed)
    return Graph.somatize(Hidden(64, 64) >> Classify(64, 10))


def load_digits(seed: int = 0, batch_size: int = 64) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders over scikit-learn's digits (pixels scaled to [0, 1])."""
    require("sklearn", "recipes")  # else an error naming the extra to install
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    x, y = sk_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        x / 16.0, y, test_size=0.25, random_state=seed, stratify=y
    )

    def tensors(xs: Any, ys: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(xs, dtype=torch.float32), torch.tensor(ys))

    gen = torch.Generator().manual_seed(seed)
    train = DataLoader(
        tensors(x_train, y_train), batch_size=batch_size, shuffle=True, generator=gen
    )
    val = DataLoader(tensors(x_val, y_val), batch_size=256)
    return train, val


def main(argv: list[str] | None = None) -> st.TrainResult:
    # (here, not at the top: the import of somatize.torch.lightning above names the extra)
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", default="runs/lightning_digits", help="checkpoints and logs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    # The data is in memory: worker processes would only add start-up time.
    warnings.filterwarnings("ignore", message=".*does not have many workers")
    # lightning 2.6 against torch >= 2.10 warns about a torch-internal API on every fit.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`")

    L.seed_everything(args.seed, verbose=False)
    train, val = load_digits(args.seed)
    lg = LightningGraph(
        make_graph(args.seed),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=3e-3),
        # Lightning steps a plain scheduler once per epoch; this dict asks for every
        # optimizer step (as the somatize Trainer does), which T_max counts in.
        scheduler=lambda opt: {
            "scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(
                opt, T_max=args.epochs * len(train)
            ),
            "interval": "step",
        },
        metrics={"acc": st.accuracy},
    )
    best = ModelCheckpoint(
        dirpath=out / "checkpoints",
        filename="{epoch}-{val_acc:.4f}",
        monitor="val_acc",
        mode="max",
        save_last=True,
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(str(out), name="tensorboard"),
        callbacks=[
            best,
            EarlyStopping(monitor="val_loss", patience=5),
            LearningRateMonitor(logging_interval="step"),
            Watch([JsonLines(out / "run.jsonl")]),
        ],
        log_every_n_steps=10,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(lg, train, val)
    r = result(trainer, lg)
    print(r)
    print(f"best val_acc: {float(best.best_model_score):.4f}")
    print(f"final lr: {trainer.optimizers[0].param_groups[0]['lr']:.3g}")  # 0 at the cosine's end
    print(f"best checkpoint: {best.best_model_path}")
    print(f"last checkpoint: {best.last_model_path}")
    print(f"tensorboard --logdir {out}")
    return r


if __name__ == "__main__":
    main()
