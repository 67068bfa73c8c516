"""The progress line: redrawn in place on a terminal, plain lines anywhere else."""

from __future__ import annotations

import io
import re

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Graph
from somatize.errors import SettingError
from tests.torch.test_watchers_torch import Body, Head, data, fit


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(text: str) -> list[str]:
    return [
        re.sub(r"[0-9.,]+ ex/s", "R ex/s", re.sub(r"in [0-9.]+s", "in Ts", line))
        for line in text.splitlines()
    ]


def test_a_stream_that_is_not_a_terminal_gets_plain_lines_one_an_epoch():
    stream = io.StringIO()
    result = fit([st.Progress(stream=stream, interval=0.0)])
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    got = lines(text)
    assert [line.split(" · loss")[0] for line in got if " · step " in line] == [
        "epoch 1/2 · step 3/6",
        "epoch 2/2 · step 6/6",
    ]
    assert [line.split(" · ")[0] for line in got] == [
        "epoch 1/2",
        "step 3",  # the evaluation after the epoch's last step
        "epoch 1",  # the epoch's mean loss
        "epoch 2/2",
        "step 6",
        "epoch 2",
        "done: 6 steps in Ts",
    ]
    assert "lr 5.00e-02 · R ex/s" in got[0] and got[1].startswith("step 3 · val_loss ")
    assert [got[2], got[5]] == [
        f"epoch {e + 1} · mean loss {v:.4f}" for e, v in enumerate(result.epoch_losses)
    ]


def test_every_steps_adds_a_plain_line_every_n_steps():
    stream = io.StringIO()
    fit([st.Progress(stream=stream, every_steps=2)])
    steps = [int(m) for m in re.findall(r"^epoch \d/2 · step (\d)/6", stream.getvalue(), re.M)]
    assert steps == [2, 3, 4, 6]  # every 2nd, and the first epoch's last (3)


def test_a_run_stopped_mid_epoch_still_writes_its_last_step():
    stream = io.StringIO()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        max_steps=2,
        watchers=[st.Progress(stream=stream)],
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Body() >> Head()), data())
    assert [line.split(" · loss")[0] for line in lines(stream.getvalue())][-2:] == [
        "epoch 1 · step 2/2",
        "done: 2 steps in Ts",
    ]


def test_a_terminal_is_redrawn_in_place():
    stream = Terminal()
    fit([st.Progress(stream=stream, interval=0.0)])
    text = stream.getvalue()
    assert len(re.findall(r"\r\x1b\[2Kepoch \d/2 · step ", text)) == 6  # every step redrawn
    assert re.findall(r"\r\x1b\[2Kepoch \d · mean loss [0-9.]+\n", text) != []  # kept lines
    assert text.count(" · mean loss ") == 2
    assert "\r\x1b[2Kdone: 6 steps" in text
    plain = io.StringIO()
    fit([st.Progress(stream=plain, redraw=False)])  # or asked not to
    assert "\x1b" not in plain.getvalue()


def test_progress_true_to_a_captured_standard_error_writes_no_control_codes(capsys):
    fit([], progress=True)
    err = capsys.readouterr().err
    assert "done: 6 steps" in err and "\x1b" not in err and "\r" not in err


def test_bad_every_steps_is_refused():
    with pytest.raises(SettingError, match="Progress every_steps must be at least 1"):
        st.Progress(every_steps=0)


def test_a_progress_watcher_reused_for_another_fit_shows_that_fits_throughput():
    from somatize.watchers import FitStart, StepEnd

    stream = io.StringIO()
    p = st.Progress(stream=stream, every_steps=1)
    p.on_event(FitStart("a", epochs=1, max_steps=0, start_step=0))
    p.on_event(StepEnd("a", step=1, epoch=0, loss=1.0, lr=0.1, examples=1000, seconds=1.0))
    p.on_event(FitStart("b", epochs=1, max_steps=0, start_step=0))  # a sweep's next run
    p.on_event(StepEnd("b", step=1, epoch=0, loss=1.0, lr=0.1, examples=10, seconds=1.0))
    first, second = stream.getvalue().splitlines()
    assert first.endswith("1,000 ex/s") and second.endswith(" 10 ex/s"), (first, second)


def test_a_resumed_fits_last_line_says_how_many_steps_it_took_itself():
    """Found by a user trial: "done: 40 steps in 0.1s" counted the whole run's steps
    against the resumed fit's own seconds."""
    from somatize.watchers import FitEnd, FitStart

    stream = io.StringIO()
    p = st.Progress(stream=stream)
    p.on_event(FitStart("a", epochs=4, max_steps=0, start_step=25, resuming=True))
    p.on_event(FitEnd("a", step=40, epoch=3, seconds=0.1, pruned=False))
    assert stream.getvalue().endswith("done: 40 steps (15 in this fit) in 0.1s\n")
    p.on_event(FitStart("b", epochs=4, max_steps=0, start_step=0))  # a fresh fit: as before
    p.on_event(FitEnd("b", step=40, epoch=3, seconds=0.1, pruned=False))
    assert stream.getvalue().endswith("done: 40 steps in 0.1s\n")


class NotebookStream(io.StringIO):
    """What a Jupyter kernel puts in sys.stderr: a stream of ipykernel's, not a terminal."""


NotebookStream.__module__ = "ipykernel.iostream"


@pytest.mark.parametrize(("stream", "shown"), [(NotebookStream(), True), (io.StringIO(), False)])
def test_progress_is_on_by_default_in_a_notebook_in_plain_lines(monkeypatch, stream, shown):
    monkeypatch.setattr("sys.stderr", stream)
    fit([], progress=None)
    text = stream.getvalue()
    assert ("done: 6 steps" in text) is shown
    assert "\r" not in text and "\x1b" not in text


def test_a_step_that_tells_its_gradient_norm_shows_it_after_the_loss():
    from somatize import Recorder
    from somatize.watchers import StepEnd

    stream, recorder = io.StringIO(), Recorder()
    fit([st.Progress(stream=stream), recorder], log_grad_norm=True)
    norm = recorder.of(StepEnd)[-1].grad_norm
    assert re.search(rf"step 6/6 · loss [0-9.]+ · grad norm {norm:.3g} · lr ", stream.getvalue())
    plain = io.StringIO()
    fit([st.Progress(stream=plain)])
    assert "grad norm" not in plain.getvalue()  # a default run's line is as before


def test_an_epoch_that_waited_long_for_its_data_says_so():
    from somatize.watchers import EpochEnd, FitStart

    stream = io.StringIO()
    p = st.Progress(stream=stream)
    p.on_event(FitStart("a", epochs=4, max_steps=0, start_step=0))
    p.on_event(EpochEnd("a", 0, 10, {}, data=3.0, steps=1.0))  # the DataLoader holds it back
    p.on_event(EpochEnd("a", 1, 20, {}, data=0.5, steps=0.1))  # under a second: not shown
    p.on_event(EpochEnd("a", 2, 30, {}, data=2.0, steps=30.0))  # a small share: not shown
    p.on_event(EpochEnd("a", 3, 40, {}, data=1.0, steps=4.0))  # a fifth: shown
    assert stream.getvalue().splitlines() == [
        "epoch 1 · waiting for data: 75% of training time",
        "epoch 4 · waiting for data: 20% of training time",
    ]


def test_a_cache_share_is_rounded_down_so_100_percent_means_every_row():
    """Found trying the feature as a user: 511 hits of 512 read ``enc 100% of 512``, the
    line one checks for "every row hit from epoch 2"; the padding warning rounds down too."""
    from somatize.watchers import EpochEnd, FitStart

    stream = io.StringIO()
    p = st.Progress(stream=stream)
    p.on_event(FitStart("a", epochs=3, max_steps=0, start_step=0))
    p.on_event(EpochEnd("a", 0, 10, {}, cache={"enc": {"hits": 0, "misses": 512}}))
    p.on_event(EpochEnd("a", 1, 20, {}, cache={"enc": {"hits": 511, "misses": 1}}))
    p.on_event(EpochEnd("a", 2, 30, {}, cache={"enc": {"hits": 512, "misses": 0}}))
    assert stream.getvalue().splitlines() == [
        "epoch 1 · cache hits: enc 0% of 512",
        "epoch 2 · cache hits: enc 99% of 512",
        "epoch 3 · cache hits: enc 100% of 512",
    ]


def test_an_epochs_mean_loss_is_a_line_of_its_own_with_its_terms():
    from somatize.watchers import EpochEnd, FitStart

    stream = io.StringIO()
    p = st.Progress(stream=stream)
    p.on_event(FitStart("a", epochs=3, max_steps=0, start_step=0))
    p.on_event(EpochEnd("a", 0, 10, {}, loss=0.5, terms={"ce": 0.25, "kl": 1e-5}))
    p.on_event(EpochEnd("a", 1, 20, {}))  # no step taken (all skipped): no mean, no line
    p.on_event(EpochEnd("a", 2, 30, {}, loss=0.125, cache={"enc": {"hits": 1, "misses": 0}}))
    assert stream.getvalue().splitlines() == [
        "epoch 1 · mean loss 0.5000 ce 0.25 kl 1e-05",
        "epoch 3 · mean loss 0.1250",
        "epoch 3 · cache hits: enc 100% of 1",
    ]


def test_the_step_line_says_how_long_the_run_has_left(monkeypatch):
    """Found by a usability audit: tqdm's bar under Lightning says the time left; the line
    said the throughput only. ``eta`` is the steps left at the fit's pace so far."""
    import time

    from somatize.watchers import FitStart, StepEnd

    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    def line(progress, step, after):
        now[0] += after
        progress.on_event(StepEnd("r", step, 0, loss=1.0, lr=0.1, examples=8, seconds=0.5))
        return progress.stream.getvalue().splitlines()[-1]

    progress = st.Progress(stream=io.StringIO(), every_steps=1)
    progress.on_event(FitStart("r", epochs=2, max_steps=0, start_step=0, total_steps=10))
    assert line(progress, 1, 3.0).endswith(" ex/s · eta 0:27")  # 9 steps left, 3 s each
    assert line(progress, 2, 1.0).endswith(" ex/s · eta 0:16")  # 4 s for 2: 2 s each
    assert line(progress, 10, 16.0).endswith(" ex/s")  # the last: nothing left
    progress.on_event(FitStart("r", epochs=0, max_steps=0, start_step=0, total_steps=0))
    assert line(progress, 1, 1.0).endswith(" ex/s")  # no planned end (data without a length)
    resumed = st.Progress(stream=io.StringIO(), every_steps=1)  # from step 6: its own pace
    resumed.on_event(FitStart("r", epochs=2, max_steps=0, start_step=6, total_steps=10))
    assert line(resumed, 7, 3.0).endswith(" · eta 0:09")
    long = st.Progress(stream=io.StringIO(), every_steps=1)
    long.on_event(FitStart("r", epochs=1, max_steps=0, start_step=0, total_steps=10_000))
    assert line(long, 1, 2.0).endswith(" · eta 5:33:18")  # 9,999 steps of 2 s
