"""Resuming with another LR scheduler than the checkpoint's is refused, naming both."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize.errors import CheckpointError

STEP = lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)  # noqa: E731
COSINE = lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)  # noqa: E731


def fit(ckpt, scheduler, epochs, resume=None):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))] * 4
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=scheduler,
        epochs=epochs,
        checkpoint=st.Checkpointing(ckpt),
        options=st.Options(progress=False),
    ).fit(nn.Linear(4, 3), data, resume=resume)


@pytest.mark.parametrize(
    ("written", "resumed", "said"),
    [
        (
            None,
            STEP,
            r"without an LR scheduler, and this Trainer has torch\.optim\.lr_scheduler"
            r"\.StepLR: its schedule would start afresh",
        ),
        (
            STEP,
            None,
            r"with an LR scheduler \(torch\.optim\.lr_scheduler\.StepLR\), and this "
            r"Trainer has none: the learning rate would stay",
        ),
        (
            STEP,
            COSINE,
            r"LR scheduler torch\.optim\.lr_scheduler\.StepLR, this run uses "
            r"torch\.optim\.lr_scheduler\.CosineAnnealingLR",
        ),
    ],
)
def test_resuming_with_another_scheduler_is_refused_naming_both(tmp_path, written, resumed, said):
    fit(tmp_path, written, epochs=1)
    with pytest.raises(CheckpointError, match=said) as e:
        fit(tmp_path, resumed, epochs=2, resume="last")
    assert "step-000000004.ckpt" in str(e.value)  # the file it would have resumed from
    assert "start a fresh run from its weights" in str(e.value)


def test_the_same_scheduler_resumes_as_the_uninterrupted_run(tmp_path):
    whole = fit(tmp_path / "whole", COSINE, epochs=2)
    fit(tmp_path / "parts", COSINE, epochs=1)
    resumed = fit(tmp_path / "parts", COSINE, epochs=2, resume="last")
    assert resumed.losses == whole.losses
    payload = st.load_checkpoint(resumed.checkpoint)
    assert payload["scheduler_class"] == "torch.optim.lr_scheduler.CosineAnnealingLR"


def test_a_checkpoint_from_before_the_class_was_kept_resumes_unchecked(tmp_path):
    fit(tmp_path, STEP, epochs=1)
    path = st.Checkpointing(tmp_path).last()
    payload = st.load_checkpoint(path)
    del payload["scheduler_class"]
    path.unlink()
    st.Checkpointing(tmp_path).save(payload, payload["step"])
    assert fit(tmp_path, STEP, epochs=2, resume="last").steps == 8


def test_resuming_with_the_scheduler_stepped_in_another_unit_is_refused(tmp_path):
    def run(every, epochs, resume=None):
        gen = torch.Generator().manual_seed(0)
        data = [(torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))] * 4
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1 / (1 + n)),
            epochs=epochs,
            checkpoint=st.Checkpointing(tmp_path),
            options=st.Options(progress=False, scheduler_every=every),
        ).fit(nn.Linear(4, 3), data, resume=resume)

    run("step", 1)  # (its scheduler stepped 4 times: it would read as 4 epochs)
    said = r"stepped every step \(Options\(scheduler_every='step'\)\), and this run steps it ev"
    with pytest.raises(CheckpointError, match=said):
        run("epoch", 2, resume="last")
    assert run("step", 2, resume="last").losses  # (as it was written: resumes)
