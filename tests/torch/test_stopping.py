"""``Options(stop_on=...)``: a signal stops the run at a step's end; it checkpoints, and
``fit`` raises ``SystemExit(128 + signum)``; ``resume="last"`` goes on bitwise.

In-process tests raise the signal from the model during a chosen step
(``signal.raise_signal``: a real signal, through the handler ``fit`` installed); the
process test sends SIGTERM from outside, while the script waits in that step."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import somatize.torch as st
from somatize import Graph
from somatize.errors import SettingError
from somatize.watchers import FitEnd, Recorder

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import preempted  # noqa: E402 -- the process test's script, imported for its model and data

ROOT = Path(__file__).resolve().parents[2]


class Body(preempted.Body):
    """The script's model (its name too: one checkpoint fits both), raising ``signals``
    during training step ``at``; it notes the SIGTERM handler each forward sees."""

    def __init__(self, at: int | None = None, signals=(signal.SIGTERM,)) -> None:
        super().__init__()
        self.at, self.signals, self.seen = at, signals, []

    def forward(self, x, ctx):
        self.seen.append(signal.getsignal(signal.SIGTERM))
        if ctx.training and ctx.step == self.at:
            for s in self.signals:
                signal.raise_signal(s)
        return super().forward(x, ctx)


def signalling(at=None, signals=(signal.SIGTERM,)) -> tuple[Graph, Body]:
    torch.manual_seed(0)
    node = Body(at, signals)
    return Graph.somatize(node), node


@pytest.fixture(scope="module")
def uninterrupted():
    return preempted.trainer(None, watch=False, stop_on=None).fit(
        preempted.graph(), preempted.data()
    )


def equal(a, b) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("watch", [False, True], ids=["fast_path", "general_loop"])
@pytest.mark.parametrize("at", [9, 12], ids=["mid_epoch", "epoch_end"])
def test_a_signal_stops_at_the_steps_end_checkpoints_and_resume_goes_on_bitwise(
    tmp_path, uninterrupted, watch, at
):
    before = signal.getsignal(signal.SIGTERM)
    g, node = signalling(at)
    with pytest.raises(SystemExit) as e:
        preempted.trainer(tmp_path, watch).fit(g, preempted.data())
    assert e.value.code == 128 + signal.SIGTERM == 143
    assert signal.getsignal(signal.SIGTERM) == before  # put back
    assert node.seen[0] != before  # (fit's own handler while it trained)
    ckpt = st.Checkpointing(tmp_path)
    written = sorted(int(p.stem.split("-")[-1]) for p in tmp_path.glob("step-*.ckpt"))
    assert written[-1] == at and ckpt.file(at).exists()  # the last periodic one: step 6
    resumed = preempted.trainer(tmp_path, watch).fit(
        preempted.graph(), preempted.data(), resume="last"
    )
    assert resumed.steps == uninterrupted.steps == 18
    assert resumed.losses == uninterrupted.losses
    equal(resumed.state, uninterrupted.state)


def test_sigusr1_through_a_tuple_exits_with_its_own_code(tmp_path):
    g, _ = signalling(4, signals=(signal.SIGUSR1,))
    with pytest.raises(SystemExit) as e:
        preempted.trainer(tmp_path, False, stop_on=("SIGTERM", "SIGUSR1")).fit(g, preempted.data())
    assert e.value.code == 128 + signal.SIGUSR1
    assert st.Checkpointing(tmp_path).file(4).exists()


def test_a_second_signal_while_stopping_changes_nothing(tmp_path):
    # SIGUSR1 first, then SIGTERM in the same step: the first decides, the process lives
    g, _ = signalling(4, signals=(signal.SIGUSR1, signal.SIGTERM))
    with pytest.raises(SystemExit) as e:
        preempted.trainer(tmp_path, True, stop_on=(signal.SIGTERM, signal.SIGUSR1)).fit(
            g, preempted.data()
        )
    assert e.value.code == 128 + signal.SIGUSR1
    assert st.Checkpointing(tmp_path).file(4).exists()


def test_a_signal_after_the_last_step_still_exits_once_the_run_is_saved(tmp_path):
    class Late:
        def on_event(self, event):
            if isinstance(event, FitEnd):
                signal.raise_signal(signal.SIGTERM)

    trainer = preempted.trainer(tmp_path, False)
    trainer.watchers = [Late()]
    with pytest.raises(SystemExit) as e:
        trainer.fit(preempted.graph(), preempted.data())
    assert e.value.code == 143 and st.Checkpointing(tmp_path).file(18).exists()


def test_the_previous_handler_is_put_back_also_when_the_loss_raises(tmp_path):
    def mine(signum, frame):  # a handler of the caller's
        raise AssertionError("not called")

    old = signal.signal(signal.SIGTERM, mine)
    try:
        trainer = preempted.trainer(tmp_path, False)
        g, node = signalling()
        trainer.fit(g, preempted.data())  # no signal: it returns
        assert signal.getsignal(signal.SIGTERM) is mine and node.seen[0] is not mine

        def broken(out, y):
            raise ValueError("broken loss")

        trainer = preempted.trainer(tmp_path / "again", False)
        trainer.loss = broken
        with pytest.raises(ValueError, match="broken loss"):
            trainer.fit(preempted.graph(), preempted.data())
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_without_stop_on_evaluate_and_predict_nothing_is_installed(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    g, node = signalling()
    trainer = preempted.trainer(None, False, stop_on=None)
    trainer.fit(g, preempted.data())
    staying = preempted.trainer(tmp_path, False)
    staying.evaluate(g, preempted.data())
    staying.predict(g, preempted.data())
    assert set(node.seen) == {before}


def test_without_a_checkpoint_it_warns_then_stops_cleanly_saving_nothing(tmp_path):
    g, _ = signalling(4)
    recorder = Recorder()
    trainer = preempted.trainer(None, False)
    trainer.watchers = [recorder]
    with pytest.warns(UserWarning, match="nothing is saved"), pytest.raises(SystemExit) as e:
        trainer.fit(g, preempted.data())
    assert e.value.code == 143
    ends = [ev for ev in recorder.events if isinstance(ev, FitEnd)]
    assert [ev.step for ev in ends] == [4]  # watchers told, at the step it stopped


def test_outside_the_main_thread_it_warns_and_installs_nothing(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    g, node = signalling()
    caught: list[BaseException] = []

    def fit():
        try:
            with pytest.warns(UserWarning, match="outside the main thread"):
                preempted.trainer(tmp_path, False).fit(g, preempted.data())
        except BaseException as e:  # (re-raised in the test's thread)
            caught.append(e)

    thread = threading.Thread(target=fit)
    thread.start()
    thread.join()
    assert not caught, caught
    assert set(node.seen) == {before}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("SIGKILL", "no process can catch"),
        (signal.SIGSTOP, "no process can catch"),
        (("SIGTERM", "KILL"), "no process can catch"),
        ("SIGTREM", "did you mean 'SIGTERM'"),
        (9999, "no signal number"),
        (15.0, "must be a signal"),
        (True, "must be a signal"),
        (["SIGTERM"], "must be a signal"),
        ((), "names no signal"),
    ],
)
def test_bad_values_are_refused_naming_the_value_and_the_fix(value, said):
    with pytest.raises(SettingError, match=said):
        st.Options(stop_on=value)


def test_names_numbers_and_tuples_are_taken():
    from somatize.torch.stopping import signals_of

    assert signals_of("sigterm") == signals_of("TERM") == signals_of(15) == (signal.SIGTERM,)
    both = (signal.SIGTERM, signal.SIGUSR1)
    assert signals_of(("SIGTERM", signal.SIGUSR1, "SIGTERM")) == both
    assert signals_of(None) == ()


@pytest.mark.slow
@pytest.mark.parametrize("watch", [False, True], ids=["fast_path", "general_loop"])
def test_a_process_sent_sigterm_exits_143_with_its_checkpoint(tmp_path, uninterrupted, watch):
    cmd = [sys.executable, "-u", str(SCRIPTS / "preempted.py"), str(tmp_path), "9"]
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    with subprocess.Popen(
        [*cmd, *(["--watch"] if watch else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line == b"step 9\n", line
            proc.send_signal(signal.SIGTERM)  # during step 9; the line lets the step go on
            _, err = proc.communicate(b"\n", timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    code = proc.returncode
    assert code == 143, err.decode()
    written = sorted(int(p.stem.split("-")[-1]) for p in tmp_path.glob("step-*.ckpt"))
    assert written == [6, 9], written  # the epoch's end, and the step it stopped at
    resumed = preempted.trainer(tmp_path, watch).fit(
        preempted.graph(), preempted.data(), resume="last"
    )
    assert resumed.losses == uninterrupted.losses
    equal(resumed.state, uninterrupted.state)
