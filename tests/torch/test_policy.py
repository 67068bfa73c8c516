"""The checkpoint policy: a mid-epoch resume must mean the same batch (audit-errors S10)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import CheckpointError
from tests.torch.test_checkpoint_resume import Crash, CrashAt


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data(n: int = 6):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen))
        for _ in range(n)
    ]


def trainer(ckpt, watchers=(), micro_batches=1, **options):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        micro_batches=micro_batches,
        checkpoint=st.Checkpointing(ckpt, every_steps=2),
        watchers=watchers,
        options=st.Options(progress=False, **options),
    )


def fit(t, train, resume=None):
    torch.manual_seed(0)
    return t.fit(Graph.somatize(Linear()), train, resume=resume)


@pytest.fixture
def mid_epoch(tmp_path):
    """A run stopped after step 4, its last checkpoint at batch 4 of 6 of epoch 0."""
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Crash):
        fit(trainer(ckpt, [CrashAt(5)]), data())
    assert st.load_checkpoint(st.Checkpointing(ckpt).last())["position"] == 4
    return ckpt


@pytest.mark.parametrize(
    ("changes", "train", "said"),
    [
        ({}, data(5), "its epoch had 6 batches, this run's has 5"),
        ({"accumulate": 2}, data(), "accumulate=1, this run has accumulate=2"),
        ({"shuffle": False}, data(), "shuffle=True, this run has shuffle=False"),
        ({"limit_train_batches": 5}, data(), "limit_train_batches=None"),
    ],
)
def test_a_mid_epoch_resume_whose_position_means_another_batch_is_refused(
    mid_epoch, changes, train, said
):
    with pytest.raises(CheckpointError, match="written mid-epoch") as e:
        fit(trainer(mid_epoch, **changes), train, resume="last")
    assert said in str(e.value) and "epoch's end" in str(e.value)


def test_another_micro_batches_resumes_from_the_same_batch_with_a_warning(mid_epoch):
    with pytest.warns(UserWarning, match="micro_batches=1, this run has micro_batches=2"):
        result = fit(trainer(mid_epoch, micro_batches=2), data(), resume="last")
    assert result.steps == 12


def test_an_epoch_end_checkpoint_resumes_with_other_data_and_settings(tmp_path):
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Crash):
        fit(trainer(ckpt, [CrashAt(7)]), data())  # last checkpoint: step 6, the epoch's end
    result = fit(trainer(ckpt, accumulate=2, shuffle=False), data(5), resume="last")
    assert result.steps == 6 + 3


def test_a_checkpoint_from_before_the_record_still_resumes(mid_epoch, tmp_path):
    payload = dict(st.load_checkpoint(st.Checkpointing(mid_epoch).last()))
    del payload["order"], payload["format"], payload["checkpoints"]
    old = st.Checkpointing(tmp_path / "old").save(payload, payload["step"])
    assert fit(trainer(tmp_path / "new"), data(5), resume=old).steps == 4 + 1 + 5
