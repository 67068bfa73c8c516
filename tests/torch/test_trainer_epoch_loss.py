"""The epoch's training loss (epoch_loss.py), Lightning's ``train_loss_epoch``:
``TrainResult.epoch_losses`` and ``EpochEnd.loss``/``.terms`` — the mean over the epoch's
examples, against a plain loop; exact across a mid-epoch resume; skipped steps left out;
old results without the field still load."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.torch.epoch_loss import EpochLoss
from somatize.watchers import EpochEnd, StepEnd
from tests.torch.test_checkpoint_resume import Crash, CrashAt
from tests.torch.test_trainer_loss_terms import SIZES, data  # (unequal batches, a short last)
from tests.torch.trainer_helpers import make_graph, plain_copy, quiet, step_parts


def two_terms(out, y):
    ce = F.cross_entropy(out, y)
    reg = out.pow(2).mean()
    return {"loss": ce + 0.1 * reg, "ce": ce, "reg": reg}


def plain_epochs(batches, k, mb, epochs=2):
    """A plain loop (groups of ``k`` batches in ``mb`` chunks, each weighed by its share of
    the group's examples); each epoch's loss and terms summed by hand over every chunk's
    examples — not over the steps."""
    m = plain_copy(make_graph())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    means = []
    for _ in range(epochs):
        sums, examples = {"loss": 0.0, "ce": 0.0, "reg": 0.0}, 0
        for parts, n in step_parts(batches, k, mb):
            opt.zero_grad(set_to_none=True)
            for xc, yc in parts:
                got = two_terms(m(xc), yc)
                (got["loss"] * (len(yc) / n)).backward()
                for name in sums:
                    sums[name] += float(got[name].detach()) * len(yc)
                examples += len(yc)
            opt.step()
        means.append({name: v / examples for name, v in sums.items()})
    return means


def fit(batches, watchers=(), k=1, mb=1, epochs=2, max_steps=None, **options):
    return st.Trainer(
        loss=two_terms,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        max_steps=max_steps,
        micro_batches=mb,
        watchers=list(watchers),
        options=quiet(shuffle=False, accumulate=k, **options),
    ).fit(make_graph(), batches)


@pytest.mark.parametrize(("k", "mb"), [(1, 1), (1, 3), (2, 1), (2, 3)])
@pytest.mark.parametrize("watched", [False, True], ids=["no-watcher", "watched"])
def test_each_epochs_loss_is_the_mean_over_its_examples_as_a_plain_loop_sums_them(k, mb, watched):
    """Without watchers (k = mb = 1: the fast path) and with them (the general step); under
    micro-batches and accumulation a step's loss is already its examples' mean."""
    batches = data()
    want = plain_epochs(batches, k, mb)
    recorder = Recorder()
    result = fit(batches, [recorder] if watched else [], k, mb)
    assert result.epoch_losses == pytest.approx([w["loss"] for w in want], rel=1e-6)
    steps = [e.loss for e in recorder.of(StepEnd)] if watched else result.losses
    per_epoch = len(steps) // 2
    sizes = [sum(SIZES[i : i + k]) for i in range(0, len(SIZES), k)]
    for e, got in enumerate(result.epoch_losses):  # the steps weighed by their examples
        told = steps[e * per_epoch : (e + 1) * per_epoch]
        assert got == sum(v * n for v, n in zip(told, sizes, strict=True)) / sum(SIZES)
    assert result.epoch_losses[0] != pytest.approx(sum(steps[:per_epoch]) / per_epoch)
    if watched:
        ends = recorder.of(EpochEnd)
        assert [e.loss for e in ends] == result.epoch_losses
        for end, w in zip(ends, want, strict=True):
            assert end.terms == pytest.approx({"ce": w["ce"], "reg": w["reg"]}, rel=1e-6)


class CrashingLoss:
    """``two_terms``, raising at its ``at``-th call: a crash inside a step without watchers."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, out, y):
        self.calls += 1
        if self.calls == self.at:
            raise Crash
        return two_terms(out, y)


@pytest.mark.parametrize("crash", ["watcher", "loss"])
@pytest.mark.parametrize("nonfinite", ["raise", "ignore"])  # (ignore: read back in flushes)
def test_a_run_resumed_in_mid_epoch_reports_the_uninterrupted_runs_epochs(
    tmp_path, nonfinite, crash
):
    """Crashed in step 8 (epoch 1, its 3rd step) after the checkpoint of step 7: the epoch's
    running sums are in it, so its mean spans both fits, bitwise. Crashed by its loss, the
    interrupted fit has no watcher: it takes the fast path (unless nonfinite="ignore"), and
    the resumed one, watched, the general path."""

    def run(folder, watchers=(), resume=None, loss=two_terms):
        return st.Trainer(
            loss=loss,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=3,
            checkpoint=st.Checkpointing(tmp_path / folder, every_steps=7),
            watchers=list(watchers),
            options=quiet(nonfinite=nonfinite),
        ).fit(make_graph(), data(), resume=resume)

    told, again = Recorder(), Recorder()
    reference = run("ref", [told])
    with pytest.raises(Crash):
        run("run", [CrashAt(8)]) if crash == "watcher" else run("run", loss=CrashingLoss(8))
    assert st.load_checkpoint(tmp_path / "run" / "step-000000007.ckpt")["position"] == 2
    resumed = run("run", [again], resume="last")
    assert resumed.epoch_losses == reference.epoch_losses  # exactly
    assert len(resumed.epoch_losses) == 3 and len(set(resumed.epoch_losses)) == 3
    assert [(e.epoch, e.loss) for e in again.of(EpochEnd)] == [
        (e.epoch, e.loss) for e in told.of(EpochEnd)[1:]
    ]
    if crash == "watcher":  # (watched before the crash too: the steps' terms were told)
        assert again.of(EpochEnd)[0].terms == told.of(EpochEnd)[1].terms


def checkpointed(folder, watchers=(), resume=None) -> st.TrainResult:
    """Two epochs of ``data()`` with ``two_terms``, checkpointed every 7 steps in ``folder``."""
    return st.Trainer(
        loss=two_terms,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        checkpoint=st.Checkpointing(folder, every_steps=7),
        watchers=list(watchers),
        options=quiet(shuffle=False),
    ).fit(make_graph(), data(), resume=resume)


def resumed_without(folder, *keys: str) -> st.TrainResult:
    """``checkpointed`` crashed in step 8, its checkpoint of step 7 written again without
    ``keys`` (as an earlier somatize wrote it), then resumed to its end."""
    from somatize.torch import integrity

    with pytest.raises(Crash):
        checkpointed(folder, [CrashAt(8)])
    path = st.Checkpointing(folder).file(7)
    payload = dict(st.load_checkpoint(path))
    for key in keys:
        del payload[key]
    integrity.write_checkpoint(path, payload)
    return checkpointed(folder, resume="last")


def test_a_checkpoint_from_before_the_sums_were_kept_resumes_with_its_own_steps(tmp_path):
    """Written by an earlier somatize: the earlier epochs' means are not known, and the
    resumed epoch's is over the steps the resumed fit takes."""
    resumed = resumed_without(tmp_path, "epoch_loss", "epoch_losses")
    assert resumed.epochs == 2 and len(resumed.losses) == 10
    own = zip(resumed.losses[7:], SIZES[2:], strict=True)  # steps 8 to 10: batches 2 to 4
    assert resumed.epoch_losses == [sum(v * n for v, n in own) / sum(SIZES[2:])]


def test_a_skipped_step_is_left_out_and_an_epoch_of_none_is_nan():
    batches = data()
    bad = (torch.full((7, 4), math.nan), batches[2][1])  # the 7-example batch: a NaN loss
    rec = Recorder()
    for watched in (False, True):
        result = fit(
            [*batches[:2], bad, *batches[3:]], [rec] if watched else [], epochs=1, nonfinite="skip"
        )
        assert result.skipped == 1
        kept = [10, 10, 10, 5]
        assert result.epoch_losses == [
            sum(v * n for v, n in zip(result.losses, kept, strict=True)) / sum(kept)
        ]
    assert rec.of(EpochEnd)[0].loss == result.epoch_losses[0]
    rec.clear()
    result = fit([bad], [rec], epochs=2, nonfinite="skip")  # no step taken: no mean
    assert result.steps == 0 and [math.isnan(v) for v in result.epoch_losses] == [True, True]
    assert [(e.loss, e.terms) for e in rec.of(EpochEnd)] == [(None, {}), (None, {})]


def test_a_run_stopped_in_mid_epoch_lists_its_finished_epochs_only():
    result = fit(data(), epochs=3, max_steps=7)  # (epoch 1 stopped after 2 of its 5 steps)
    assert result.epochs == len(result.epoch_losses) == 1


def test_the_sums_of_a_checkpoint_are_plain_values_read_back_as_written():
    sums = EpochLoss()
    sums.add(0.5, 10)
    sums.add_terms({"ce": 0.25}, 10)
    again = EpochLoss.restored(sums.state())
    assert (
        again.state()
        == sums.state()
        == {
            "total": 5.0,
            "examples": 10,
            "terms": {"ce": 2.5},
            "term_examples": 10,
        }
    )
    assert again.take() == (0.5, {"ce": 0.25}) and again.take() == (None, {})
    assert EpochLoss.restored({"total": "x", "examples": -1}).state() == EpochLoss().state()


def test_a_result_pickled_before_the_field_was_added_loads_with_none():
    result = fit(data(), epochs=1)
    assert len(result.epoch_losses) == 1
    del result.__dict__["epoch_losses"]  # as a result pickled by an earlier somatize
    old = pickle.loads(pickle.dumps(result))
    assert old.epoch_losses == [] and old.losses == result.losses
    assert "epoch_losses" not in result.__dict__  # (the state unpickled, not the original)


def test_a_remembered_result_stored_before_the_field_was_added_is_recalled():
    from somatize.torch.codecs import default_codecs
    from somatize.torch.result_store import FORMAT, decode_result, encode_result
    from somatize.values import decode, encode

    result = fit(data(), epochs=1)
    codecs = default_codecs()
    stored = decode(encode_result(result, codecs), codecs)
    assert stored["fields"]["epoch_losses"] == result.epoch_losses
    del stored["fields"]["epoch_losses"]  # as an earlier somatize wrote it
    old = encode({"format": FORMAT, "fields": stored["fields"]}, codecs, where="the TrainResult")
    recalled = decode_result(old, codecs, key="k")
    assert recalled is not None and recalled.recalled
    assert recalled.epoch_losses == [] and recalled.losses == result.losses
