"""Resuming mid-epoch when loading the data draws from the global RNG: random augmentation in
``Dataset.__getitem__``, a sampler without a generator of its own. The checkpoint holds the
RNG state the epoch began with, so a resumed run draws the skipped batches as the
uninterrupted one did, and then the rest from the checkpoint's own state."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

import somatize.torch as st
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, graph


class Augmented(Dataset):
    """Each example with noise drawn from the global torch RNG at every read."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(40, 4, generator=gen)
        self.y = torch.randint(0, 3, (40,), generator=gen)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        return self.x[i] + 0.1 * torch.randn(4), self.y[i]


LOADERS = {
    "augmented, shuffled": lambda: DataLoader(Augmented(), batch_size=6, shuffle=True),
    # a sampler drawing from the global RNG when the epoch's iteration begins
    "weighted sampler": lambda: DataLoader(
        Augmented(), batch_size=6, sampler=WeightedRandomSampler(torch.arange(40.0) + 1, 40)
    ),
}


class CrashingLoss:
    """cross_entropy that raises at its ``n``-th call: a crash in the loop without watchers."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, out, y):
        self.calls += 1
        if self.calls == self.n:
            raise Crash
        return F.cross_entropy(out, y)


def trainer(tmp_path, loss=F.cross_entropy, watchers=()) -> st.Trainer:
    return st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=2e-2),
        epochs=3,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=3, keep=2),
        watchers=watchers,
        seed=5,
        options=st.Options(progress=False),
    )


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("path", ["loop with watchers", "fast loop"])
def test_resume_mid_epoch_with_data_drawing_random_numbers_is_bitwise_identical(
    tmp_path, loader, path
):
    make = LOADERS[loader]
    reference = trainer(tmp_path / "ref").fit(graph(0), make())
    assert reference.steps == 21  # 7 batches an epoch
    # the crash at step 11 finds the checkpoint of step 9, two batches into the 2nd epoch
    crashing = (
        trainer(tmp_path, watchers=[CrashAt(11)])
        if path == "loop with watchers"
        else trainer(tmp_path, loss=CrashingLoss(11))
    )
    with pytest.raises(Crash):
        crashing.fit(graph(0), make())
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert (last["step"], last["epoch"], last["position"]) == (9, 1, 2)
    resumed = trainer(tmp_path).fit(graph(7), make(), resume="last")
    assert_same(resumed, reference)


class Quiet:
    """A watcher that does nothing: it only makes the Trainer take its loop with watchers."""

    def on_event(self, event) -> None:
        pass


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("watchers", [(), (Quiet(),)], ids=["fast loop", "loop with watchers"])
def test_a_run_stopped_by_max_steps_mid_epoch_extends_bitwise(tmp_path, loader, watchers):
    """The loop reads one batch past the last step (to learn whether the epoch ended); what
    that read drew must not reach the final checkpoint."""
    make = LOADERS[loader]
    reference = trainer(tmp_path / "ref").fit(graph(0), make())
    short = trainer(tmp_path, watchers=watchers)
    short.max_steps = 10  # past the checkpoint of step 9: the final one is written at 10
    assert short.fit(graph(0), make()).steps == 10
    extended = trainer(tmp_path, watchers=watchers).fit(graph(7), make(), resume="last")
    assert_same(extended, reference)


def test_resuming_with_persistent_workers_warns_that_it_is_not_exact(tmp_path):
    def make():
        return DataLoader(
            Augmented(), batch_size=20, shuffle=True, num_workers=1, persistent_workers=True
        )

    first = trainer(tmp_path)
    first.epochs = 1
    first.fit(graph(0), make())
    with pytest.warns(UserWarning, match="persistent_workers=True.*not be bitwise"):
        trainer(tmp_path).fit(graph(0), make(), resume="last")


def test_a_snapshot_puts_every_generator_back_and_converts_to_a_checkpoints_state():
    import random

    import numpy as np

    from somatize.torch.rng import as_state, put_back, rng_state, snapshot

    taken = snapshot()
    full = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1))
    put_back(taken)
    assert (random.random(), np.random.rand(), torch.rand(1)) == first
    put_back(as_state(taken))  # the checkpoint's form puts back the same states
    assert (random.random(), np.random.rand(), torch.rand(1)) == first
    converted = as_state(taken)
    assert converted is not None and converted.keys() == full.keys()
    assert torch.equal(converted["torch"], full["torch"])
    assert torch.equal(converted["python"][1], full["python"][1])
    assert torch.equal(converted["numpy"][1], full["numpy"][1])
