"""A JsonLines run log rewritten on a resume (run_log.py), SIGKILLed at a random byte of the
rewrite or before its rename: the old log stays whole, and the next resume trims it."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import somatize.keepers.atomic as atomic
import somatize.run_log as run_log
from somatize import JsonLines
from somatize.watchers import FitStart
from tests.test_run_log import STEPS, fit, records, straight

from .conftest import TRIALS

RESUMED = FitStart("c", 3, 0, 8, STEPS, 0, True, True)  # from the checkpoint of step 8


class _Dying:
    """A file that writes ``budget`` bytes, then kills its process (nothing flushed after)."""

    def __init__(self, f: Any, budget: int) -> None:
        self.f, self.budget = f, budget

    def write(self, data: bytes) -> int:
        if len(data) > self.budget:
            self.f.write(data[: self.budget])
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self.budget -= len(data)
        return int(self.f.write(data))


def _resume_dying(path: str, budget: int) -> None:
    real = run_log.atomic_file

    @contextlib.contextmanager
    def dying(target: Path, **kw: Any) -> Iterator[Any]:
        with real(target, **kw) as f:
            yield _Dying(f, budget)

    def killed(src: str, dst: str) -> None:  # the temp file whole, not yet renamed
        os.kill(os.getpid(), signal.SIGKILL)

    run_log.atomic_file = dying  # type: ignore[assignment]
    atomic.replace = killed  # type: ignore[assignment]
    JsonLines(path).on_event(RESUMED)


def test_sigkill_at_a_random_byte_of_the_rewrite_leaves_the_log_whole(tmp_path, rng, monkeypatch):
    ctx = multiprocessing.get_context("fork")
    want = straight(tmp_path)
    for trial in range(TRIALS):
        path = tmp_path / f"trial{trial}" / "run.jsonl"
        with monkeypatch.context() as m:  # written as before JsonLines dropped anything, so
            m.setattr(JsonLines, "_supersede", lambda self, start: None)  # the rewrite drops
            fit(JsonLines(path), "a", until=9)  # lines inside the file (a's 7 to 9) too
            fit(JsonLines(path), "b", start=6, until=9, position=2)
        before = path.read_bytes()
        budget = rng.randint(0, len(before))  # (past the new log's size: killed at the rename)
        child = ctx.Process(target=_resume_dying, args=(str(path), budget))
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL, f"budget {budget}"
        assert path.read_bytes() == before, f"budget {budget}"  # the old log, whole
        left = [p.name for p in path.parent.iterdir() if p.name != "run.jsonl"]
        assert all(n.startswith(".run.jsonl.") and n.endswith(".tmp") for n in left)
        fit(JsonLines(path), "c", start=8, evaluated=True)  # the resume, again: it goes through
        assert records(path) == want, f"budget {budget}"
