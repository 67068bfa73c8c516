"""Options(smoke=N): Lightning's fast_dev_run — one epoch of N batches, nothing kept."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.errors import CheckpointError, SettingError
from tests.torch.trainer_helpers import batches, make_graph, quiet


def adam(ps):
    return torch.optim.Adam(ps, lr=1e-2)


def make(tmp_path=None, watchers=(), **options):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=adam,
        epochs=5,
        max_steps=100,
        metrics={"acc": st.accuracy},
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=1) if tmp_path else None,
        watchers=watchers,
        options=quiet(**options),
    )


def test_a_smoke_run_trains_one_batch_evaluates_one_and_keeps_nothing(tmp_path):
    rec = Recorder()
    g, train, val = make_graph(), batches(6), batches(3, seed=4)
    result = make(tmp_path, watchers=[rec], smoke=True, shuffle=False).fit(g, train, val=val)
    assert (result.steps, result.epochs, len(result.losses)) == (1, 1, 1)
    assert result.checkpoint is None and not (tmp_path / "ckpt").exists()
    assert rec.events == []  # no watcher is told
    # what it trained and evaluated: one step on the first batch, then val's first batch
    h = make_graph()
    m = st.module(h)
    opt = adam(list(m.parameters()))
    loss = F.cross_entropy(m(train[0][0]), train[0][1])
    loss.backward()
    opt.step()
    assert result.losses == [loss.item()]
    for k, v in st.state(h).items():
        assert torch.equal(result.state[k], v), k
    want = st.Trainer(loss=F.cross_entropy, metrics={"acc": st.accuracy}).evaluate(h, val[:1])
    assert result.metrics == [
        {"step": 1, "epoch": 0, "val_loss": want["loss"], "val_acc": want["acc"]}
    ]


def test_after_a_smoke_run_the_model_and_the_rng_are_as_they_were():
    g = make_graph()
    m = st.module(g).eval()  # (kept: one module per graph while it is alive)
    before = {k: v.clone() for k, v in st.state(g).items()}
    torch.manual_seed(123)
    smoke = make(smoke=2).fit(g, batches(6), val=batches(2))
    drawn = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(drawn, torch.rand(3))  # the global RNG put back
    assert smoke.steps == 2 and any(not torch.equal(v, before[k]) for k, v in smoke.state.items())
    assert all(torch.equal(v, before[k]) for k, v in st.state(g).items())  # weights put back
    assert not m.training and st.module(g) is m  # and the mode
    # so the real run after it is the run without it, bitwise
    real = make().fit(g, batches(6), val=batches(2))
    alone = make().fit(make_graph(), batches(6), val=batches(2))
    assert real.losses == alone.losses and real.metrics == alone.metrics
    for k, v in alone.state.items():
        assert torch.equal(real.state[k], v), k


def test_smoke_n_takes_n_batches_of_each_and_one_evaluation_whatever_the_schedule():
    val = batches(5, seed=4)
    trainer = make(smoke=3, accumulate=2, eval_every_steps=1, min_epochs=4)
    result = trainer.fit(make_graph(), batches(6), val=val)
    assert result.steps == 2  # 3 batches in groups of 2 + 1
    assert [m["step"] for m in result.metrics] == [2]  # once, at the epoch's end
    h = make_graph()
    st.load_state(h, result.state)
    plain = st.Trainer(loss=F.cross_entropy, metrics={"acc": st.accuracy})
    assert result.metrics[0]["val_loss"] == plain.evaluate(h, val[:3])["loss"]


def test_evaluate_and_predict_read_n_batches_under_smoke():
    g, data = make_graph(), batches(5, seed=4)
    smoke = st.Trainer(loss=F.cross_entropy, options=quiet(smoke=2))
    assert smoke.evaluate(g, data) == st.Trainer(loss=F.cross_entropy).evaluate(g, data[:2])
    assert len(smoke.predict(g, data)) == 2
    assert len(st.Trainer(loss=F.cross_entropy).predict(g, data)) == 5


def test_a_smoke_run_reads_no_checkpoint_and_leaves_an_earlier_runs_alone(tmp_path):
    make(tmp_path).fit(make_graph(), batches(2), val=batches(1))  # a real run: checkpoints
    files = sorted((tmp_path / "ckpt").iterdir())
    stamps = [f.stat().st_mtime_ns for f in files]
    # resume= is not read, and the directory holding checkpoints is no reason to refuse
    result = make(tmp_path, smoke=True).fit(make_graph(), batches(2), val=batches(1), resume="last")
    assert result.steps == 1 and result.checkpoint is None
    assert sorted((tmp_path / "ckpt").iterdir()) == files
    assert [f.stat().st_mtime_ns for f in files] == stamps


@pytest.mark.parametrize(
    ("resume", "error", "match"),
    [
        (True, SettingError, "resume must be 'last' or a checkpoint's path, not True"),
        ("latest", SettingError, "resume='latest' is neither 'last' nor a checkpoint's path"),
        ("last", CheckpointError, r"resume='last' needs checkpoint=Checkpointing\(dir\)"),
        ("gone.pt", CheckpointError, r"fit\(resume='gone.pt'\) under Options\(smoke=...\): no"),
    ],
)
def test_a_smoke_run_refuses_a_resume_the_real_run_would_refuse(resume, error, match):
    with pytest.raises(error, match=match):
        make(smoke=True).fit(make_graph(), batches(2), resume=resume)


def test_a_smoke_run_given_a_checkpoints_path_does_not_read_it(tmp_path):
    make(tmp_path).fit(make_graph(), batches(2))
    last = st.Checkpointing(tmp_path / "ckpt").last()
    last.write_bytes(b"torn")  # the real run would refuse it; the smoke run does not read it
    result = make(smoke=True).fit(make_graph(), batches(2), resume=last)
    assert result.steps == 1 and result.checkpoint is None


def test_a_smoke_run_refuses_a_fresh_start_over_an_earlier_runs_checkpoints(tmp_path):
    make(tmp_path).fit(make_graph(), batches(2))
    with pytest.raises(CheckpointError, match="already holds checkpoints of an earlier run"):
        make(tmp_path, smoke=True).fit(make_graph(), batches(2))  # as the real run would
    assert make(tmp_path, smoke=True).fit(make_graph(), batches(2), resume="last").steps == 1


def test_the_real_runs_settings_are_still_checked():
    t = make(smoke=True)
    t.pruner = st.Patience("val_loss")
    with pytest.raises(SettingError, match="a pruner is asked after each evaluation"):
        t.fit(make_graph(), batches(2))  # no val=: the real run would fail the same way


@pytest.mark.parametrize("value", [-1, 1.5, "yes", None])
def test_bad_smoke_values_are_refused(value):
    with pytest.raises(SettingError, match=r"Options\(smoke=.*must be True"):
        st.Options(smoke=value)


def test_a_smoke_run_has_no_sanity_check_its_one_evaluation_is_one():
    from tests.torch.test_trainer_sanity import Counting

    val = Counting(batches(4, seed=4))
    make(smoke=2).fit(make_graph(), batches(6), val=val)
    assert val.read == 2
