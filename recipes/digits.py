"""Handwritten digits: a small MLP graph, trained with checkpoints and TensorBoard logs.

    python recipes/digits.py                      # under a minute on a 2-core CPU (longer when busy)
    python recipes/digits.py --epochs 30 --seed 1 --out runs/digits
    python recipes/digits.py --resume             # continue an interrupted run
    tensorboard --logdir runs/digits

scikit-learn's bundled ``load_digits`` (1,797 8×8 images, no download), split 80/20
(stratified, seeded), trained as a somatize graph ``Hidden >> Hidden >> Classify``
whose nodes return ``Opaque`` tensors. It prints the validation accuracy and exits
with status 1 if it is below 0.95, so ``make demo`` fails loudly.

Other recipes import it: ``make_graph()``, ``load_data(seed)``, ``train(seed=...)``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import require

TARGET = 0.95
Batches = list[tuple[torch.Tensor, torch.Tensor]]


class Hidden(Node):
    """A linear layer, ReLU and dropout."""

    def __init__(self, inputs: int, outputs: int, dropout: float = 0.1) -> None:
        self.lin = nn.Linear(inputs, outputs)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, ctx):
        return Done(Opaque(self.drop(F.relu(self.lin(x)))))  # (batch, outputs)


class Classify(Node):
    """The logits of the ten digits; reports the mean confidence to the watchers."""

    def __init__(self, inputs: int, classes: int = 10) -> None:
        self.out = nn.Linear(inputs, classes)

    def forward(self, x, ctx):
        logits = self.out(x)  # (batch, 10)
        confidence = logits.detach().softmax(-1).amax(-1).mean()
        return Done(Opaque(logits), metrics={"confidence": confidence})


def make_graph(hidden: int = 128, dropout: float = 0.1) -> Graph:
    """The model: ``Hidden(64, h) >> Hidden(h, h) >> Classify(h, 10)``."""
    return Graph.somatize(
        Hidden(64, hidden, dropout) >> Hidden(hidden, hidden, dropout) >> Classify(hidden)
    )


def load_data(
    seed: int = 0, batch_size: int = 64, val_fraction: float = 0.2
) -> tuple[Batches, Batches]:
    """Train and validation batches of ``(x, y)``: x (batch, 64) in [0, 1], y (batch,) digits."""
    require("sklearn", "recipes")  # else an error naming the extra to install
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_val, y_train, y_val = train_test_split(
        digits.data,
        digits.target,
        test_size=val_fraction,
        random_state=seed,
        stratify=digits.target,
    )

    def batches(x, y) -> Batches:
        x = torch.tensor(x, dtype=torch.float32) / 16.0  # pixel values are 0..16
        y = torch.tensor(y, dtype=torch.long)
        return list(zip(x.split(batch_size), y.split(batch_size), strict=True))

    return batches(x_train, y_train), batches(x_val, y_val)


def train(
    seed: int = 0,
    epochs: int = 20,
    out: str | Path = "runs/digits",
    *,
    resume: bool = False,
    progress: bool | None = None,
) -> st.TrainResult:
    """Train on the digits; checkpoints in ``out/ckpt``, TensorBoard logs in ``out``.

    Args:
        seed: the split, the initial weights and the batch order.
        epochs: passes over the training set.
        out: the run's directory. A fresh run (``resume=False``) moves a run found
            there (its checkpoints and logs) to ``out/previous`` first, replacing the one
            kept there before, and says so.
        resume: continue from ``out/ckpt/last`` (a fresh start when there is none).
        progress: show a progress line (default: when standard error is a terminal).
    """
    out = Path(out)
    train_batches, val_batches = load_data(seed)  # (first: a failure here touches no run)
    if not resume:
        set_aside(out, hint=" (--resume continues a run instead)")
    torch.manual_seed(seed)
    g = make_graph()
    steps = epochs * len(train_batches)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-4),
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps),
        epochs=epochs,
        metrics={"acc": st.accuracy},
        # the newest 3 and the best by val_acc, which rotation never deletes
        checkpoint=st.Checkpointing(out / "ckpt", every_steps=100, keep=3, best=1),
        watchers=[st.TensorBoard(out)],
        pruner=st.Patience("val_acc", patience=8, mode="max"),  # early stopping
        seed=seed,
        options=st.Options(monitor="val_acc", mode="max", progress=progress),
    )
    return trainer.fit(g, train_batches, val=val_batches, resume="last" if resume else None)


def set_aside(out: Path, files: Sequence[str] = (), hint: str = "") -> None:
    """Move the run in ``out`` (its ``ckpt`` directory, TensorBoard logs and ``files``) to
    ``out/previous``, replacing the one kept there: a fresh run starts clean, and the last
    one is not lost (to a forgotten ``--resume``, here). ``hint`` ends the line it prints."""
    found = [out / "ckpt", *(out / f for f in files), *out.glob("events.out.tfevents.*")]
    found = [p for p in found if p.exists()]
    if not found:
        return
    previous = out / "previous"
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir(parents=True)
    for p in found:
        p.rename(previous / p.name)
    print(f"{out} held a run: moved to {previous}{hint}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    parser.add_argument("--seed", type=int, default=0, help="split, initial weights, batch order")
    parser.add_argument("--out", default="runs/digits", help="checkpoints and TensorBoard logs")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/ckpt/last")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small matrices: a second thread only waits (13% more CPU, same wall)
    result = train(args.seed, args.epochs, args.out, resume=args.resume)
    accuracy = result.metric("val_acc")
    print(
        f"digits: validation accuracy {accuracy:.4f} (best {result.best:.4f}) after {result.steps} "
        f"steps, {result.epochs} epochs, {result.seconds:.1f}s{' (stopped early)' if result.pruned else ''}"
    )
    print(f"checkpoint: {result.checkpoint} (best: {result.best_checkpoint})")
    print(f"TensorBoard: tensorboard --logdir {args.out}")
    if accuracy < TARGET:
        print(f"FAILED: validation accuracy {accuracy:.4f} is below {TARGET}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
