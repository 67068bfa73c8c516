"""Gradient accumulation across batches: exact against one batch as large, resumed bitwise."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer
from tests.torch.trainer_helpers import Capture, batches, make_graph, quiet


@pytest.mark.parametrize(("k", "micro"), [(2, 1), (3, 1), (3, 2)])
def test_accumulated_gradient_equals_one_batch_k_times_larger(k, micro):
    # sizes 10, 10, 4, ...: the smaller batch weighs less, as in one concatenated batch
    parts = batches(6, size=10)
    parts[2] = (parts[2][0][:4], parts[2][1][:4])
    opts: list[Capture] = []
    g = make_graph()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: opts.append(Capture(ps)) or opts[-1],
        micro_batches=micro,
        options=quiet(shuffle=False, accumulate=k),
    ).fit(g, parts)
    groups = [parts[i : i + k] for i in range(0, len(parts), k)]
    assert len(opts[0].grads) == len(groups)
    m = st.module(g)
    for got, group in zip(opts[0].grads, groups):
        x = torch.cat([b[0] for b in group])
        y = torch.cat([b[1] for b in group])
        m.zero_grad()
        F.cross_entropy(m(x), y).backward()
        want = [p.grad for p in m.parameters()]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_accumulation_steps_once_per_group_and_the_last_group_may_be_smaller():
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=quiet(accumulate=4),
    ).fit(make_graph(), batches(6))
    assert result.steps == 4  # 4 + 2 batches an epoch
    assert result.num_examples == 60


def test_resume_with_accumulation_is_bitwise_identical(tmp_path):
    reference = trainer(tmp_path / "ref", accumulate=2).fit(graph(0), data(), val=data(2))
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(5)], accumulate=2).fit(graph(0), data(), val=data(2))
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert last["position"] % 2 == 0 or last["position"] == 5  # a group boundary
    resumed = trainer(tmp_path, accumulate=2).fit(graph(4), data(), val=data(2), resume="last")
    assert_same(resumed, reference)


def _every_step(path, watchers=(), **options) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=2e-2),
        epochs=2,
        checkpoint=st.Checkpointing(path, every_steps=1, keep=20),
        watchers=watchers,
        seed=5,
        options=quiet(**options),
    )


@pytest.mark.parametrize(
    "options",
    [{"accumulate": 3}, {"nonfinite": "skip", "shuffle": False}],
    ids=["accumulate", "skip"],
)
def test_a_checkpoint_read_further_into_its_epoch_than_its_step_resumes(tmp_path, options):
    # Under accumulate=3 step 2 is taken after 6 batches of epoch 0; under "skip", a batch
    # skipped at the start puts every later checkpoint of the epoch one batch ahead of its
    # step. Such checkpoints were refused as damaged ("'position' is out of range").
    train = data(10)
    if options.get("nonfinite") == "skip":
        train[0][0][0, 0] = float("nan")  # the first batch's loss: skipped
    reference = _every_step(tmp_path / "ref", **options).fit(graph(0), train)
    with pytest.raises(Crash):
        _every_step(tmp_path / "cut", [CrashAt(3)], **options).fit(graph(0), train)
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "cut").last())
    assert (last["step"], last["epoch"]) == (2, 0)
    assert last["position"] > last["step"]
    resumed = _every_step(tmp_path / "cut", **options).fit(graph(4), train, resume="last")
    assert resumed.losses == reference.losses
    for name, value in reference.state.items():
        assert torch.equal(value, resumed.state[name]), name


def test_bad_accumulate_is_refused():
    with pytest.raises(ValueError, match="accumulate must be at least 1"):
        st.Options(accumulate=0)
    with pytest.raises(TypeError, match="accumulate must be a whole number, not 2.0"):
        st.Options(accumulate=2.0)
