"""``TrainResult.terms``: a loss function's terms at every step, as ``losses`` holds the
loss — on the fast path, the general step and the pending (``nonfinite="ignore"``) one,
against a plain loop; the whole run's across a resume; kept by a remembered run."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

import somatize.torch as st
from somatize import Recorder
from somatize.torch.loss_terms import record_terms, restored_terms
from somatize.watchers import EpochEnd, StepEnd
from tests.torch.test_checkpoint_resume import Crash, CrashAt
from tests.torch.test_trainer_epoch_loss import (
    CrashingLoss,
    checkpointed,
    plain_epochs,
    resumed_without,
    two_terms,
)
from tests.torch.test_trainer_loss_terms import data, plain_loop, vae_like
from tests.torch.trainer_helpers import make_graph, quiet


def fit(loss=vae_like, watchers=(), k=1, mb=1, epochs=2, **options):
    return st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        micro_batches=mb,
        watchers=list(watchers),
        options=quiet(shuffle=False, accumulate=k, **options),
    ).fit(make_graph(), data())


@pytest.mark.parametrize(("k", "mb"), [(1, 1), (1, 3), (2, 1), (2, 3)])
@pytest.mark.parametrize("watched", [False, True], ids=["no-watcher", "watched"])
@pytest.mark.parametrize("nonfinite", ["raise", "ignore"])  # (ignore: read back in flushes)
def test_each_steps_terms_are_a_plain_loops_and_what_watchers_are_told(k, mb, watched, nonfinite):
    """Without watchers (k = mb = 1: the fast path) and with them (the general step); under
    "ignore" the terms are read back with the losses, in float32, at the epoch's end."""
    _, losses, terms = plain_loop(data(), k, mb)
    recorder = Recorder()
    result = fit(watchers=[recorder] if watched else [], k=k, mb=mb, nonfinite=nonfinite)
    assert list(result.terms) == ["ce", "reg", "rows"]
    want = {name: [t[name] for t in terms] for name in result.terms}
    if nonfinite == "raise":
        assert result.losses == losses
        assert result.terms == want  # bitwise: the floats a plain loop reads
    else:  # (float32 in the flush: "rows", a Python float, is rounded there)
        for name, values in want.items():
            assert result.terms[name] == pytest.approx(values, rel=1e-6), name
    assert all(len(v) == len(result.losses) for v in result.terms.values())
    if watched:  # the history holds what each StepEnd told
        told = recorder.of(StepEnd)
        for name, values in result.terms.items():
            assert [e.terms[name] for e in told] == pytest.approx(values, rel=1e-6), name


@pytest.mark.parametrize(("k", "mb"), [(1, 1), (1, 3), (2, 1), (2, 3)])
@pytest.mark.parametrize("watched", [False, True], ids=["no-watcher", "watched"])
@pytest.mark.parametrize("nonfinite", ["raise", "ignore"])
def test_each_epochs_terms_are_their_means_over_its_examples_as_the_loss(k, mb, watched, nonfinite):
    """``epoch_terms`` is to the terms what ``epoch_losses`` is to the loss (Lightning's
    ``train_<term>_epoch``): each epoch's mean over its examples, summed by hand by a plain
    loop; with watchers, what ``EpochEnd.terms`` says; without, kept all the same."""
    want = plain_epochs(data(), k, mb)
    recorder = Recorder()
    result = fit(
        loss=two_terms, watchers=[recorder] if watched else [], k=k, mb=mb, nonfinite=nonfinite
    )
    assert list(result.epoch_terms) == ["ce", "reg"]
    for name in ("ce", "reg"):
        assert result.epoch_terms[name] == pytest.approx([w[name] for w in want], rel=1e-6)
    sizes = [sum(n for n in [10, 10, 7, 10, 5][i : i + k]) for i in range(0, 5, k)]
    per_epoch = len(sizes)
    for name, values in result.epoch_terms.items():  # the steps' terms weighed by examples
        for e, got in enumerate(values):
            told = result.terms[name][e * per_epoch : (e + 1) * per_epoch]
            mean = sum(v * n for v, n in zip(told, sizes, strict=True)) / 42
            assert got == pytest.approx(mean, rel=1e-6 if nonfinite == "ignore" else 1e-12)
    if watched:
        ends = recorder.of(EpochEnd)
        assert [dict(e.terms) for e in ends] == [
            {k: v[e] for k, v in result.epoch_terms.items()} for e in range(2)
        ]


def test_a_loss_without_terms_leaves_the_history_empty():
    result = fit(loss=lambda out, y: vae_like(out, y)["loss"])
    assert result.terms == {} and result.epoch_terms == {} and len(result.losses) == 10
    assert result.summary()["final_terms"] == {}


def test_the_summary_gives_the_last_steps_terms_beside_its_loss():
    result = fit(loss=two_terms, epochs=1)
    summary = result.summary()
    assert summary["final_loss"] == result.losses[-1]
    assert summary["final_terms"] == {"ce": result.terms["ce"][-1], "reg": result.terms["reg"][-1]}


def test_a_skipped_step_has_no_terms_as_it_has_no_loss():
    def nan_at_third(out, y, calls=[0]):  # noqa: B006 (a counter kept across calls)
        calls[0] += 1
        got = two_terms(out, y)
        if calls[0] == 3:
            got["loss"] = got["loss"] * float("nan")
        return got

    result = fit(loss=nan_at_third, epochs=1, nonfinite="skip")
    assert result.skipped == 1 and len(result.losses) == 4
    assert {k: len(v) for k, v in result.terms.items()} == {"ce": 4, "reg": 4}
    assert all(math.isfinite(v) for values in result.terms.values() for v in values)


@pytest.mark.parametrize("crash", ["watcher", "loss"])
@pytest.mark.parametrize("nonfinite", ["raise", "ignore"])
def test_a_resumed_run_reports_the_uninterrupted_runs_terms(tmp_path, crash, nonfinite):
    """Crashed in step 8 after the checkpoint of step 7: the history up to it is in the
    checkpoint, the resumed fit adds its own steps (the crash by the loss: a fit without
    watchers, the fast path unless "ignore")."""

    def run(folder, watchers=(), resume=None, loss=two_terms):
        return st.Trainer(
            loss=loss,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=3,
            checkpoint=st.Checkpointing(tmp_path / folder, every_steps=7),
            watchers=list(watchers),
            options=quiet(nonfinite=nonfinite),
        ).fit(make_graph(), data(), resume=resume)

    reference = run("ref")
    with pytest.raises(Crash):
        run("run", [CrashAt(8)]) if crash == "watcher" else run("run", loss=CrashingLoss(8))
    saved = st.load_checkpoint(tmp_path / "run" / "step-000000007.ckpt")["terms"]
    assert {k: len(v) for k, v in saved.items()} == {"ce": 7, "reg": 7}
    resumed = run("run", resume="last")
    assert resumed.losses == reference.losses
    assert resumed.terms == reference.terms  # exactly
    assert resumed.epoch_terms == reference.epoch_terms  # (the epoch's sums checkpointed)
    assert len(resumed.epoch_terms["ce"]) == 3
    assert len(resumed.terms["ce"]) == 15


def test_a_checkpoint_from_before_the_history_was_kept_gives_nan_before_the_resume(tmp_path):
    reference = checkpointed(tmp_path / "ref")
    resumed = resumed_without(tmp_path / "run", "terms", "epoch_terms")
    assert len(resumed.losses) == 10
    for name, values in resumed.terms.items():
        assert all(math.isnan(v) for v in values[:7]), name
        assert values[7:] == reference.terms[name][7:], name
    for name, values in resumed.epoch_terms.items():  # epoch 0 ended before the checkpoint
        assert math.isnan(values[0]) and values[1] == reference.epoch_terms[name][1], name


def test_the_history_pads_a_term_given_late_or_left_out_with_nan():
    history: dict[str, list[float]] = {}
    record_terms(history, {"a": 1.0}, 1)
    record_terms(history, {"a": torch.tensor(2.0), "b": 3.0}, 2)  # b: first at step 2
    record_terms(history, {"b": 4.0}, 3)  # a left out
    record_terms(history, {}, 4)
    assert history["a"][:2] == [1.0, 2.0] and math.isnan(history["a"][2])
    assert math.isnan(history["b"][0]) and history["b"][1:3] == [3.0, 4.0]
    assert all(len(v) == 4 and math.isnan(v[3]) for v in history.values())
    assert restored_terms(None, 3) == {} and restored_terms("x", 3) == {}
    assert restored_terms({"a": [1, 2, 3, 4], "b": "x"}, 3) == {"a": [1.0, 2.0, 3.0]}


def test_a_result_pickled_or_remembered_before_the_field_was_added_loads_without_terms():
    from somatize.torch.codecs import default_codecs
    from somatize.torch.result_store import FORMAT, decode_result, encode_result
    from somatize.values import decode, encode

    result = fit(loss=two_terms, epochs=1)
    codecs = default_codecs()
    stored = decode(encode_result(result, codecs), codecs)
    assert stored["fields"]["terms"] == result.terms  # a remembered run keeps them
    assert decode_result(encode_result(result, codecs), codecs, "k").terms == result.terms
    del stored["fields"]["terms"]  # as an earlier somatize wrote it
    old = encode({"format": FORMAT, "fields": stored["fields"]}, codecs, where="the TrainResult")
    recalled = decode_result(old, codecs, key="k")
    assert recalled is not None and recalled.terms == {} and recalled.losses == result.losses
    del result.__dict__["terms"]  # as a result pickled by an earlier somatize
    assert pickle.loads(pickle.dumps(result)).terms == {}
