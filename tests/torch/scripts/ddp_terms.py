"""A loss of several terms under DDP, launched by ``tests/torch/test_trainer_loss_terms.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_terms.py OUT_DIR

The loss function gives the cross-entropy as the loss and as a term, ``ce``, and this
rank's number as another, ``rank``: over the ranks, weighed by their examples, ``rank`` is
rank 1's share of the step's (or the evaluation's) examples. The training data's last batch
is smaller, so the ranks' last steps of an epoch differ in examples; validation set "one"
is one batch, which rank 1 never sees. Each epoch's mean (``EpochEnd``, ``epoch_losses``)
is over every rank's examples; a second fit under ``nonfinite="ignore"`` reads the losses
back at the epoch's end instead (each rank's own, all-reduced then). Every rank writes what
it got to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.watchers import EpochEnd, StepEnd

RANK = int(os.environ.get("RANK", "0"))


def loss(out, y):
    ce = F.cross_entropy(out, y)
    return {"loss": ce, "ce": ce, "rank": float(RANK)}


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    gen = torch.Generator().manual_seed(1)

    def batch(n):
        return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)

    train = [batch(4) for _ in range(7)] + [batch(3)]
    val = {"all": [batch(5), batch(7), batch(3)], "one": [batch(6)]}

    def fit(watchers, **options):
        torch.manual_seed(0)
        return st.Trainer(
            loss=loss,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            micro_batches=2,
            watchers=watchers,
            options=st.Options(progress=False, shuffle=False, **options),
        ).fit(torch.nn.Linear(4, 3), train, val=val)

    recorder = Recorder()
    result = fit([recorder])
    ignored = fit([], nonfinite="ignore")
    steps = [(e.loss, dict(e.terms), e.examples) for e in recorder.of(StepEnd)]
    epochs = [(e.loss, dict(e.terms)) for e in recorder.of(EpochEnd)]
    torch.save(
        {
            "steps": steps,
            "losses": result.losses,
            "metrics": result.metrics,
            "epochs": epochs,
            "epoch_losses": result.epoch_losses,
            "ignored": ignored.epoch_losses,
            "terms": result.terms,  # (TrainResult.terms: every rank's steps, as losses)
            "ignored_terms": ignored.terms,  # (read back and all-reduced with the losses)
            "ignored_losses": ignored.losses,
            "epoch_terms": result.epoch_terms,
            "ignored_epoch_terms": ignored.epoch_terms,
        },
        out / f"rank{RANK}.pt",
    )


if __name__ == "__main__":
    main()
