"""At exit, a DDP process waits for gloo's worker threads to be idle (``ddp.settle_gloo``):
a worker freeing a collective's tensors once the interpreter is finalizing aborted the
rank after all its work ("terminate called without an active exception")."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest

from somatize.torch import ddp

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="thread states are read from /proc")


def named_worker(seconds: float, started: threading.Event, done: list[bool]) -> threading.Thread:
    """A thread the OS knows as gloo's worker, running (not sleeping) for ``seconds``."""

    def run() -> None:
        libc = ctypes.CDLL(None)
        libc.prctl(15, b"pt_gloo_runloop", 0, 0, 0)  # PR_SET_NAME: this thread's name
        started.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(range(1000))  # (busy: state R, as a preempted worker is)
        done.append(True)

    return threading.Thread(target=run, daemon=True)


def test_exit_waits_until_a_running_gloo_worker_is_idle():
    started, done = threading.Event(), []
    worker = named_worker(0.3, started, done)
    worker.start()
    started.wait()
    ddp.settle_gloo(limit=10.0)
    assert done == [True]  # returned only once the worker had stopped running
    worker.join()


def test_exit_does_not_wait_past_its_limit_nor_without_gloo_workers():
    started, done = threading.Event(), []
    worker = named_worker(3.0, started, done)
    worker.start()
    started.wait()
    ddp.settle_gloo(limit=0.2)
    assert done == []  # gave up at the limit: the worker still runs
    worker.join()
    begin = time.monotonic()
    ddp.settle_gloo(limit=10.0)  # no worker running: three quiet polls
    assert time.monotonic() - begin < 5.0


def test_importing_somatize_torch_registers_the_wait_at_exit(tmp_path):
    # a process that exits while a (fake) gloo worker still runs: the wait lets it finish
    # its work, which here writes a file, before the interpreter finalizes
    marker = tmp_path / "worker-finished"
    script = f"""
import ctypes, threading, time
import somatize.torch

def run():
    ctypes.CDLL(None).prctl(15, b"pt_gloo_runloop", 0, 0, 0)
    started.set()
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        sum(range(1000))
    open({str(marker)!r}, "w").close()
    time.sleep(30)  # idle, as a worker waiting for work

started = threading.Event()
threading.Thread(target=run, daemon=True).start()
started.wait()
"""
    import subprocess

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert marker.exists()


def test_exit_waits_for_nothing_without_proc(monkeypatch):
    """macOS and Windows have no /proc: a gloo worker busy meanwhile is not waited for."""
    started, done = threading.Event(), []
    worker = named_worker(2.0, started, done)
    worker.start()
    started.wait()
    listdir = ddp.os.listdir

    def no_proc(path="."):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return listdir(path)

    monkeypatch.setattr(ddp.os, "listdir", no_proc)
    assert ddp._gloo_busy() is None
    ddp.settle_gloo(limit=30.0)
    assert not done  # returned at once, the worker still running
    worker.join()
