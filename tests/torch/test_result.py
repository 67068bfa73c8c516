"""TrainResult.best_record: the evaluation that gave ``best``, the one ``best_checkpoint`` holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from tests.torch.test_trainer_best import fit
from tests.torch.trainer_helpers import batches, make_graph, plain_copy, quiet


def test_the_best_record_is_the_evaluation_the_best_checkpoint_holds(tmp_path):
    # val_score peaks at the 2nd evaluation and ties there at the 4th: the first is best
    _, _, result = fit(tmp_path, [0.25, 0.75, 0.5, 0.75, 0.125], keep=1, best=1)
    record = result.best_record
    assert record is not None
    assert (record["epoch"], record["val_score"]) == (1, 0.75)
    assert result.metric("val_score") == 0.125  # the last evaluation's
    assert record == result.metrics[1]
    assert Path(result.best_checkpoint).name == f"step-{record['step']:09d}.ckpt"


def test_its_values_are_those_of_the_selected_weights_by_plain_torch(tmp_path):
    val = batches(2, seed=5)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        epochs=6,
        metrics={"acc": st.accuracy},
        checkpoint=st.Checkpointing(tmp_path / "ckpt", keep=1, best=1),
        options=quiet(monitor="val_loss"),
    )
    g = make_graph()
    result = trainer.fit(g, batches(4), val=val)
    record = result.best_record
    assert record is not None and record["val_loss"] == result.best
    st.load_state(g, st.load_checkpoint(result.best_checkpoint))
    x, y = torch.cat([b[0] for b in val]), torch.cat([b[1] for b in val])
    with torch.no_grad():
        out = plain_copy(g)(x)
    assert record["val_loss"] == pytest.approx(F.cross_entropy(out, y).item())
    assert record["val_acc"] == (out.argmax(-1) == y).sum().item() / len(y)


def test_no_evaluation_no_best_record():
    result = st.Trainer(
        loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), options=quiet()
    ).fit(make_graph(), batches(2))
    assert result.best_record is None
