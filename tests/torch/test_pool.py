"""TorchPool: a killed worker costs a re-run of its call, never the campaign."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import BrokenExecutor

import pytest

import somatize.torch as st
from somatize.errors import WorkerLostError


def square_or_die(job):
    """Square ``x``; kill this worker first if asked (once, or every time)."""
    x, marker, always = job
    if marker is not None and (always or not os.path.exists(marker)):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x, os.getpid()


@pytest.mark.slow
def test_a_worker_killed_once_costs_one_rerun_and_every_run_finishes(tmp_path):
    marker = str(tmp_path / "died")
    jobs = [(i, marker if i == 3 else None, False) for i in range(8)]
    with st.executor(workers=2) as pool:
        runs = st.run_all(pool, square_or_die, jobs)
        assert pool.restarts == 1
        assert pool.submit(square_or_die, (9, None, False)).result()[0] == 81  # still usable
    assert runs.lost == {}
    assert [r[0] for r in runs.results] == [i * i for i in range(8)]
    assert os.path.exists(marker)


@pytest.mark.slow
def test_a_fresh_pool_is_never_forked_from_the_broken_pools_thread(tmp_path):
    # the replacement is made by the broken pool's thread, the main thread running on: with
    # start_method="fork" said, it was forked from there (a lock held there, held for good)
    marker = str(tmp_path / "died")
    with st.executor(workers=1, start_method="fork") as pool:
        assert pool.start_method == "fork"
        runs = st.run_all(
            pool, square_or_die, [(i, marker if i == 1 else None, False) for i in range(3)]
        )
        assert runs.lost == {} and pool.restarts == 1
        assert pool.start_method == "forkserver"


@pytest.mark.slow
def test_a_run_that_always_kills_its_worker_is_reported_lost_and_the_others_finish(tmp_path):
    marker = str(tmp_path / "died")
    jobs = [(i, marker if i == 2 else None, True) for i in range(6)]
    with st.executor(workers=2) as pool:
        runs = st.run_all(pool, square_or_die, jobs)
        future = pool.submit(square_or_die, (5, marker, True))
        with pytest.raises(
            WorkerLostError,
            match=r"call \d+, square_or_die\(\(5, '.*', True\)\), was lost: its worker died 2 time",
        ):
            future.result()
        assert isinstance(future.exception(), BrokenExecutor)  # old except clauses still work
    assert list(runs.lost) == [2] and "WorkerLostError" in runs.lost[2]
    assert runs.results[2] is None
    assert [r[0] for r in runs.finished] == [0, 1, 9, 16, 25]


@pytest.mark.slow
def test_retries_zero_loses_only_the_run_whose_worker_died(tmp_path):
    marker = str(tmp_path / "died")
    jobs = [(i, marker if i == 1 else None, False) for i in range(5)]
    with st.executor(workers=2, retries=0) as pool:
        runs = st.run_all(pool, square_or_die, jobs)
    assert list(runs.lost) == [1]
    assert [r[0] for r in runs.finished] == [0, 4, 9, 16]


def test_an_exception_the_run_raises_is_raised_not_counted_as_lost():
    with st.executor(workers=1) as pool, pytest.raises(ZeroDivisionError) as raised:
        st.run_all(pool, lambda x: 1 / x, [1, 0, 2])
    assert r"fn(items[1])" in "".join(raised.value.__notes__)  # names the run that raised
    with pytest.raises(ValueError, match=r"st\.executor\(retries=-1\): give an int of 0 or more"):
        st.executor(retries=-1)
    with pytest.raises(ValueError, match=r"start_method='bogus'\): .*pass one of those, or None"):
        st.executor(start_method="bogus")


def test_a_call_after_shutdown_names_the_function_and_the_fix():
    pool = st.executor(workers=1)
    pool.shutdown()
    with pytest.raises(
        RuntimeError, match=r"after shutdown: submit\(print, \.\.\.\).*st\.executor"
    ):
        pool.submit(print)


def test_errors_return_keeps_the_runs_that_finished_beside_the_one_that_raised():
    with st.executor(workers=1) as pool:
        runs = st.run_all(pool, lambda x: 1 / x, [1, 0, 4], errors="return")
    assert runs.results == [1.0, None, 0.25]
    assert list(runs.failed) == [1] and isinstance(runs.failed[1], ZeroDivisionError)
    assert "fn(items[1])" in "".join(runs.failed[1].__notes__)
    assert runs.finished == [1.0, 0.25] and runs.lost == {}


def test_errors_return_works_on_any_executor_and_a_bad_errors_value_is_refused():
    from concurrent.futures import ThreadPoolExecutor

    def run(seed):
        if seed == 2:
            raise RuntimeError("diverged")
        return 0.5 + seed / 10

    with ThreadPoolExecutor(2) as pool:
        runs = st.run_all(pool, run, range(4), errors="return")
        with pytest.raises(ValueError, match="errors must be 'raise'.*or 'return'.*'ignore'"):
            st.run_all(pool, run, range(4), errors="ignore")  # type: ignore[arg-type]
    assert runs.finished == [0.5, 0.6, 0.8]
    assert str(runs.failed[2]) == "diverged"
    assert st.summarize(runs.finished, "val_acc").n == 3


@pytest.mark.slow
def test_a_lost_run_and_a_failed_run_are_both_left_out_of_finished(tmp_path):
    marker = str(tmp_path / "died")

    def run(job):
        if job == 3:
            raise ValueError("bad config")
        return square_or_die((job, marker if job == 1 else None, True))[0]

    with st.executor(workers=2, retries=0) as pool:
        runs = st.run_all(pool, run, range(5), errors="return")
    assert list(runs.lost) == [1] and list(runs.failed) == [3]
    assert runs.finished == [0, 4, 16]


def test_the_note_on_a_failed_run_shows_its_item_so_a_sweep_says_which_config():
    from concurrent.futures import ThreadPoolExecutor

    def train(config):
        if config["lr"] > 0.5:
            raise FloatingPointError("loss is nan")
        return config["lr"]

    grid = [{"lr": 0.1, "width": 8}, {"lr": 1.0, "width": 16}, {"lr": 0.2, "width": "w" * 500}]
    with ThreadPoolExecutor(2) as pool:
        runs = st.run_all(pool, train, grid, errors="return")
        notes = "".join(runs.failed[1].__notes__)
        assert "fn(items[1]) — items[1] = {'lr': 1.0, 'width': 16}" in notes
        grid[2]["lr"] = 2.0
        runs = st.run_all(pool, train, grid, errors="return")
        assert len("".join(runs.failed[2].__notes__)) < 400  # a long item is cut short


def _frozen(_):
    import gc

    return gc.get_freeze_count()


def test_a_worker_freezes_what_it_inherited():
    # a full collection in a worker scans what the worker made, not torch and the parent
    with st.executor(workers=1) as pool:
        assert pool.submit(_frozen, 0).result() > 10_000


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"threads_per_worker": 0}, r"threads_per_worker=0\).*at least 1"),
        ({"threads_per_worker": 1.5}, r"threads_per_worker=1.5\).*whole number"),
    ],
)
def test_bad_executor_settings_are_refused_before_any_worker_starts(kw, match):
    from somatize.errors import SettingError

    with pytest.raises(SettingError, match=match):
        st.executor(workers=1, **kw)


def test_an_argument_that_cannot_be_pickled_is_named():
    import threading

    with st.executor(workers=1) as pool:
        with pytest.raises(TypeError, match="pickle") as info:
            pool.submit(max, 1, 2, key=threading.Lock())
        notes = "".join(info.value.__notes__)
        assert "submit(max, ...): keyword argument 'key' (lock) cannot be pickled" in notes
        with pytest.raises(TypeError) as info:
            pool.submit(max, threading.Lock(), 2)
        assert "positional argument 0 (lock)" in "".join(info.value.__notes__)
        assert pool.submit(max, 1, 2).result() == 2  # the pool goes on


def _start_and_hold(job):
    """Say that run ``i`` started; the first two hold their workers until ``go`` exists."""
    i, started, go = job
    open(os.path.join(started, str(i)), "w").close()
    deadline = time.monotonic() + 30  # (a safety valve: the queued runs wait behind these)
    while i < 2 and not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    return i


@pytest.mark.slow
def test_an_exception_leaving_the_with_block_cancels_the_runs_not_started(tmp_path):
    started, go = tmp_path / "started", tmp_path / "go"
    started.mkdir()
    futures = []
    with pytest.raises(KeyboardInterrupt), st.executor(workers=2) as pool:
        futures = [pool.submit(_start_and_hold, (i, str(started), str(go))) for i in range(6)]
        for f in futures[2:]:  # one cancelled: let the two running runs finish
            f.add_done_callback(lambda _: go.touch())
        deadline = time.monotonic() + 120
        while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        raise KeyboardInterrupt  # Ctrl-C, while runs 0 and 1 run and 2..5 are queued
    assert sorted(p.name for p in started.iterdir()) == ["0", "1"]  # no queued run started
    assert [f.result() for f in futures[:2]] == [0, 1]  # the running ones were waited for
    assert all(f.cancelled() for f in futures[2:])


def test_a_normal_exit_waits_for_every_queued_run():
    with st.executor(workers=1) as pool:
        futures = [pool.submit(abs, -i) for i in range(5)]
    assert [f.result(timeout=0) for f in futures] == [0, 1, 2, 3, 4]


def test_items_that_are_tuples_of_arguments_are_told_how_to_unpack_them():
    from concurrent.futures import ThreadPoolExecutor

    def run(lr, width, seed):
        return lr * width + seed

    grid = [(0.1, 8, 0), (0.01, 16, 1)]
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(TypeError) as raised:
            st.run_all(pool, run, grid)
        notes = "".join(raised.value.__notes__)
        assert "fn(items[0])" in notes and "lambda args: fn(*args)" in notes
        assert st.run_all(pool, lambda args: run(*args), grid).finished == [0.8, 1.16]
        with pytest.raises(TypeError) as other:  # an item that is not a tuple: no such note
            st.run_all(pool, run, [0.1])
        assert "fn(*args)" not in "".join(other.value.__notes__)


def _state_dict(seed):
    import torch

    torch.manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(8) for i in range(200)}


def test_results_hold_no_file_descriptor_per_tensor_in_the_parent():
    # A result's tensors travelled by torch's shared-memory reducer: one file descriptor per
    # tensor, held here for as long as the result lives. A sweep of ResNet state dicts (~300
    # tensors each) hit the usual limit of 1024 open files at its fourth run.
    fds = len(os.listdir("/proc/self/fd"))
    with st.executor(workers=1) as pool:
        results = list(pool.map(_state_dict, range(3)))
    assert len(os.listdir("/proc/self/fd")) < fds + 50
    assert not any(t.is_shared() for r in results for t in r.values())
    assert all(
        r["layer0.weight"].equal(_state_dict(i)["layer0.weight"]) for i, r in enumerate(results)
    )


def test_a_result_arriving_for_a_run_cancelled_meanwhile_is_dropped_quietly():
    # map's iterator cancels the other futures when one raises; a result unpickled in the
    # meantime raised InvalidStateError in the pool's callback ("exception calling callback")
    import pickle

    from somatize.torch.pool import _deliver, _Task
    from somatize.torch.pool_worker import Packed

    task = _Task(0, b"", "fn()")
    task.future.cancel()
    _deliver(task, Packed(pickle.dumps({"w": 1})))
    _deliver(task, Packed(b"not a pickle"))
    assert task.future.cancelled()


def test_a_loss_told_for_a_run_cancelled_meanwhile_is_dropped_quietly():
    """Found by a fresh-clone run: a spawn pool failing at once (a script without the main
    guard) made map's caller see ``InvalidStateError: CANCELLED_AND_NOTIFIED`` instead of
    the ``WorkerLostError`` saying why — another call's future, cancelled by map as the
    first failure ended it, was then told its own loss. The cancel here comes inside the
    window between the pool's done() check and its telling."""
    import types
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from somatize.torch.pool import _Task

    task = _Task(1, b"", "train(1)")

    def never_started():
        task.future.cancel()  # the caller, meanwhile: map's iterator cancelling the rest
        return True

    gen = types.SimpleNamespace(
        never_started=never_started, ctx=types.SimpleNamespace(get_start_method=lambda: "spawn")
    )
    inner: Future = Future()
    inner.set_exception(BrokenProcessPool("a worker failed to start"))
    with st.executor(workers=1) as pool:
        pool._settle(task, gen, inner)  # (raised InvalidStateError)
    assert task.future.cancelled()


def sleep_then_pid(seconds):
    time.sleep(seconds)
    return os.getpid()


@pytest.mark.slow
def test_a_call_handed_to_a_worker_is_running_and_not_cancelled_as_process_pool_says():
    # before: running() stayed False, and cancel() said True while the worker ran it on
    with st.executor(workers=1) as pool:
        busy = pool.submit(sleep_then_pid, 1.5)
        deadline = time.monotonic() + 60
        while not busy.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert busy.running()
        assert not busy.cancel() and not busy.cancelled()
        waiting = [pool.submit(sleep_then_pid, 0) for _ in range(4)]
        assert waiting[-1].cancel() and waiting[-1].cancelled()  # still in the pool's queue
        assert isinstance(busy.result(), int) and not busy.running()
        assert all(isinstance(f.result(), int) for f in waiting[:-1])


def test_ctrl_c_in_run_all_cancels_its_runs_not_started_as_map_does():
    # without a with block, the runs left queued ran for nobody: at exit, the interpreter
    # waits for every pending call (a sweep of 100 runs went on for hours after Ctrl-C)
    import threading
    from concurrent.futures import ThreadPoolExecutor

    main, ran, submitted, cancelled = threading.get_ident(), [], [], threading.Event()

    def run(i):
        ran.append(i)
        if i == 0:
            while len(submitted) < 5:
                time.sleep(0.01)
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, while the others wait
            cancelled.wait(10)
        return i

    def submit(*args):
        future = real(*args)
        future.add_done_callback(lambda f: cancelled.set() if f.cancelled() else None)
        submitted.append(future)
        return future

    pool = ThreadPoolExecutor(1)
    real, pool.submit = pool.submit, submit  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        st.run_all(pool, run, range(5))
    pool.shutdown(wait=True)
    assert ran == [0]
    assert all(f.cancelled() for f in submitted[1:])


_MAIN_CLASS = """
import dataclasses, sys
import somatize.torch as st

@dataclasses.dataclass
class Out:
    n: int

def fn(t):
    return Out(t)

if __name__ == "__main__":
    with st.executor(workers=1, start_method=sys.argv[1]) as pool:
        got = list(pool.map(fn, [1, 2]))
    assert got == [Out(1), Out(2)] and isinstance(got[0], Out), got
    print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_result_of_a_class_defined_in_main_comes_back_from_a_fresh_worker(tmp_path, method):
    """Found by an outside audit: the worker rebuilt the class from the shipped code, then
    pickled the result by reference to ``__main__``, where its class is another object:
    a PicklingError, with a note saying to return plain values."""
    import subprocess
    import sys

    script = tmp_path / "main_class.py"
    script.write_text(_MAIN_CLASS)
    done = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
