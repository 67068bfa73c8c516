"""Ctrl-C on a campaign: the runs interrupted stop, and no queued run starts after them.

Found by an outside audit: a terminal's Ctrl-C reaches the workers too; the interrupted
call was caught by the standard-library worker loop, which took the next queued call at
once and ran it to the end, the pool's abort flag being set only when the parent reached
its shutdown (late, when it was busy: a C call, a plot). Each run here leaves a marker file
as it starts, so a queued run that started is seen whatever the timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path

import pytest

import somatize.torch as st


def _mark_then_hold(job):
    """Add this worker's pid to ``started/<i>`` as the run starts; runs 0 and 1 then wait
    for Ctrl-C (or ``stop`` beside ``started``, or two minutes), the others return at once."""
    i, started = job
    with open(Path(started) / str(i), "a") as f:  # a line per start: a run sent again shows
        f.write(f"{os.getpid()}\n")
    if i < 2:
        _hold(Path(started).parent / "stop")
    return i


@contextlib.contextmanager
def _released(folder: Path) -> Iterator[None]:
    """On the way out (a failed assert too), the runs still holding end: the pool's exit,
    which waits for them, does not wait two minutes."""
    try:
        yield
    finally:
        (folder / "stop").touch()


def _hold(stop: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not stop.exists():
        time.sleep(0.01)


def _catch_ctrl_c(started):
    """A run that handles Ctrl-C itself (saves, and returns what it has)."""
    (Path(started) / "catcher").write_text(str(os.getpid()))
    try:
        _hold(Path(started) / "stop")
    except KeyboardInterrupt:
        return "caught"
    return "not interrupted"


def _started(folder: Path, count: int) -> list[str]:
    """The runs started, once ``count`` have (each file written in one line's write)."""
    deadline = time.monotonic() + 120
    while len([p for p in folder.iterdir() if p.stat().st_size]) < count:
        assert time.monotonic() < deadline, f"the runs never started: {list(folder.iterdir())}"
        time.sleep(0.01)
    return sorted(p.name for p in folder.iterdir())


def _pid(folder: Path, name: str) -> int:
    return int((folder / name).read_text().split()[0])


def _ignores_sigint(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.slow
def test_ctrl_c_reaching_the_workers_starts_no_queued_run_and_the_pool_runs_on(tmp_path):
    started = tmp_path / "started"
    started.mkdir()
    with st.executor(workers=2) as pool, _released(tmp_path):
        futures = [pool.submit(_mark_then_hold, (i, str(started))) for i in range(6)]
        assert _started(started, 2) == ["0", "1"]
        for name in ("0", "1"):  # Ctrl-C in the workers (this process, busy, not yet)
            os.kill(_pid(started, name), signal.SIGINT)
        done, _ = wait(futures, timeout=300)  # (before, never for a cancelled call)
        assert len(done) == 6
        assert sorted(p.name for p in started.iterdir()) == ["0", "1"]  # before: 0 to 5
        assert all(isinstance(f.exception(), KeyboardInterrupt) for f in futures[:2])
        assert all(f.cancelled() for f in futures[2:])
        # the same pool after the interrupt: a call sent now runs (on a fresh pool)
        assert pool.submit(abs, -3).result(timeout=300) == 3
    with st.executor(workers=2) as fresh:  # and a new pool
        assert list(fresh.map(abs, [-1, -2], timeout=300)) == [1, 2]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_idle_worker_ignores_ctrl_c_so_the_running_runs_are_not_sent_again(tmp_path):
    # before: the idle worker died of Ctrl-C, the pool broke, and the runs beside it, sent
    # again to a fresh pool, started over (and ran to the end) while the campaign was aborted
    started = tmp_path / "started"
    started.mkdir()
    with st.executor(workers=3) as pool, _released(tmp_path):
        futures = [pool.submit(_mark_then_hold, (i, str(started))) for i in range(3)]
        assert futures[2].result(timeout=300) == 2  # run 2: on the third worker, now idle
        _started(started, 3)  # (runs 0 and 1 were taken before run 2, not always begun yet)
        running = {_pid(started, name) for name in ("0", "1")}
        idle = _pid(started, "2")
        assert idle not in running and _ignores_sigint(idle)
        assert not any(_ignores_sigint(pid) for pid in running)  # a run is interrupted
        for pid in {idle} | running:  # Ctrl-C
            os.kill(pid, signal.SIGINT)
        assert all(isinstance(f.exception(timeout=300), KeyboardInterrupt) for f in futures[:2])
        assert pool.restarts == 0
    assert [len((started / n).read_text().split()) for n in ("0", "1")] == [1, 1]


@pytest.mark.slow
def test_a_run_that_handles_ctrl_c_itself_does_not_abort_the_pool(tmp_path):
    with st.executor(workers=1) as pool, _released(tmp_path):
        caught = pool.submit(_catch_ctrl_c, str(tmp_path))
        after = [pool.submit(abs, -i) for i in range(4)]
        _started(tmp_path, 1)
        os.kill(_pid(tmp_path, "catcher"), signal.SIGINT)
        assert caught.result(timeout=300) == "caught"
        assert [f.result(timeout=300) for f in after] == [0, 1, 2, 3]


_CAMPAIGN = """
import json, signal, sys
from collections.abc import Iterator
from concurrent.futures import wait
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, for the workers
import somatize.torch as st
from tests.torch.test_pool_interrupt import _mark_then_hold

if __name__ == "__main__":
    started, report = sys.argv[1], sys.argv[2]
    futures = []
    try:
        with st.executor(workers=2) as pool:
            futures = [pool.submit(_mark_then_hold, (i, started)) for i in range(6)]
            # this process, busy elsewhere when Ctrl-C comes (a C call, a plot), raises its
            # KeyboardInterrupt once the runs have settled: late, whatever the machine
            interrupted = []
            signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
            print("submitted", flush=True)
            wait(futures, timeout=300)
            if interrupted:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        states = ["cancelled" if f.cancelled() else type(f.exception()).__name__ for f in futures]
        json.dump(states, open(report, "w"))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups")
def test_ctrl_c_to_the_process_group_starts_no_queued_run(tmp_path, subprocess_env):
    started = tmp_path / "started"
    started.mkdir()
    script = tmp_path / "campaign.py"
    script.write_text(textwrap.dedent(_CAMPAIGN))
    with subprocess.Popen(  # (subprocess_env's path holds this checkout's tests too)
        [sys.executable, str(script), str(started), str(tmp_path / "report.json")],
        env=subprocess_env,
        start_new_session=True,  # its own process group, as a terminal's job
        stdout=subprocess.PIPE,
    ) as parent:
        try:
            assert parent.stdout is not None and parent.stdout.readline() == b"submitted\n"
            assert _started(started, 2) == ["0", "1"]
            os.killpg(parent.pid, signal.SIGINT)  # Ctrl-C: the parent and every worker
            assert parent.wait(timeout=300) == 0
        finally:
            if parent.poll() is None:
                os.killpg(parent.pid, signal.SIGKILL)
                parent.wait()
    assert sorted(p.name for p in started.iterdir()) == ["0", "1"]  # before: 0 to 5
    states = json.loads((tmp_path / "report.json").read_text())
    assert states == ["KeyboardInterrupt"] * 2 + ["cancelled"] * 4
