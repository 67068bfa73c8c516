"""``JsonLines``: the core's run log, one JSON object per event, appended to a file.

Every line is one ``write`` on a file opened for appending, so a process killed at any
instant leaves whole lines but, at most, its last. A resumed training run keeps one of
each, as ``CSVLog`` and ``TensorBoard`` do: told a resumed ``FitStart``, the log drops
what the interrupted attempt logged after the checkpoint the run resumes from (it logs
it again), rewriting the file atomically; see ``JsonLines`` for the rule.
"""

from __future__ import annotations

import errno
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

from .keepers.atomic import atomic_file
from .platforms import BINARY, pread
from .watchers import Event, FitStart, NodeEnd, NodeStart

__all__ = ["JsonLines"]


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: a mapping as an object, a tuple or list as an array
    (``StepEnd.lrs``, ``CacheRows.keys``), numbers (0-d tensors too) as numbers — a NaN or
    infinity, which JSON has no number for, as its text ``"nan"`` — and anything else as
    its ``repr``."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    try:
        f = float(value)  # floats, and 0-d tensors/arrays
    except (TypeError, ValueError):
        return repr(value)
    return f if math.isfinite(f) else str(f)


class JsonLines:
    """A run log: one JSON object per event, appended to ``path``.

    Every line is written with a single ``write`` on a file opened for appending. A
    process killed in the middle of a write may leave its last line torn (the kernel
    copies a long line page by page); a writer that finds a torn last line starts on a
    new line, and ``read`` skips torn lines. A short write (a full disk) raises.

    A resumed fit keeps one of each step and evaluation, as ``CSVLog`` and ``TensorBoard``
    do. Told a ``FitStart`` with ``start_step`` > 0, the log drops what the run it resumes
    logged and the resumed run logs again: the records of a step after ``start_step``; at
    ``start_step``, an evaluation (``Metrics`` of node ``""``) the checkpoint does not hold
    (``start_evaluated`` False) and the ``EpochEnd`` of an epoch the checkpoint was written
    inside of (``start_position`` > 0); a record without a step (``RunStart``,
    ``CacheHit``... of a graph logging here too) where the next record of its attempt with
    one goes (it was logged on the way there), or none follows (logged by an attempt killed
    then). The attempts' ``FitStart`` records stay, but one begun after ``start_step``: they
    tell when each attempt began, from which step. Told a ``FitStart`` with ``resuming`` and
    ``start_step`` 0 (no checkpoint yet: an attempt killed before its first), the log drops
    that attempt whole.

    The run resumed is the log's last: its ``FitStart`` at step 0 and the attempts after it
    that resumed a step an attempt before them logged. Records of earlier runs are never
    touched, nor is the last run when it cannot be the one resumed: it holds no ``StepEnd``
    at ``start_step`` (the run was logged elsewhere until now), or it logged a ``FitEnd``
    past ``start_step`` (for ``start_step`` 0, any ``FitEnd``): a run that ended is taken for
    another run, as when runs of a sweep, each with its own checkpoints, append to one log
    (resuming a run that ended from an earlier checkpoint of it appends too). So give each
    run its own log where runs of a sweep may be resumed out of order. Each resume's rule
    applies to all the attempts before it, so a log written before ``JsonLines`` did this is
    trimmed too. Lines that are not JSON stay as they are (``read`` names them), but a torn
    one in the run's attempts, which ``read`` skips. The file is rewritten, only when there
    is something to drop, through a temp file renamed over it: a process killed meanwhile
    leaves the old one whole. One process writes a log at a time: two fits appending to one
    file at once (two processes, or two threads sharing a ``JsonLines``) may lose records to
    a rewrite.

    Args:
        path: the log file (its directory is created).
        nodes: also log ``NodeStart``/``NodeEnd`` (verbose; off by default).
    """

    # a class default: __del__ runs on an object whose __init__ never did (a keyword it
    # does not take), and said AttributeError
    _fd: int | None = None

    def __init__(self, path: str | os.PathLike[str], *, nodes: bool = False) -> None:
        self._fd = None  # first: __del__ runs even if the mkdir below fails
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"JsonLines takes the path of the log file to write, not {path!r:.60}; e.g. "
                "JsonLines('runs/events.jsonl')"
            )
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(
                errno.EISDIR,
                f"JsonLines takes the path of a log file, and {self.path} is a directory; pass "
                f"a file in it, e.g. JsonLines({str(self.path / 'events.jsonl')!r})",
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.nodes = nodes
        self._fresh_line = False  # whether the next line must start with "\n" (a torn tail)

    def on_event(self, event: Event) -> None:
        if not self.nodes and isinstance(event, (NodeStart, NodeEnd)):
            return
        if isinstance(event, FitStart) and (event.start_step > 0 or event.resuming):
            self._supersede(event)
        record = {"event": type(event).__name__, "time": time.time()}
        record.update({f.name: _plain(getattr(event, f.name)) for f in fields(event)})
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | BINARY, 0o666)
            self._fresh_line = _torn_tail(self._fd)
        if self._fresh_line:  # after a torn line: start a new one rather than join it
            line = b"\n" + line
        written = os.write(self._fd, line)
        self._fresh_line = written != len(line)
        if written != len(line):
            raise OSError(
                errno.ENOSPC,
                f"JsonLines: wrote {written} of the {len(line)} bytes of a line to {self.path} "
                "(is the disk full?); that line is torn, and the next starts on a new line",
            )

    def _supersede(self, start: FitStart) -> None:
        """Drop what the run ``start`` resumes logged after its checkpoint (see the class)."""
        self.close()  # (reopened at the next write: the file is replaced)
        try:
            f = open(self.path, "rb")  # noqa: SIM115 -- closed below, after the rewrite
        except FileNotFoundError:
            return
        with f:
            plan = _superseded(f, _Start.of(start))
            if plan is None:
                return
            begin, drop = plan
            try:
                with atomic_file(self.path) as out:
                    f.seek(0)
                    _copy(f, out, begin)
                    for raw, gone in zip(f, drop or ()):
                        if not gone:
                            out.write(raw if raw.endswith(b"\n") else raw + b"\n")
            except OSError as e:
                raise OSError(
                    e.errno,
                    f"JsonLines: could not rewrite {self.path} without what the resumed run logs "
                    f"again ({e}); the log is as it was. Free space there, or log to a new file",
                ) from e

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process opens its own file
        return {**self.__dict__, "_fd": None}

    @staticmethod
    def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """The records of a run log. A torn line (cut short by a killed writer: its object
        is not closed, wherever the cut fell — also right after a nested ``}``) is skipped.

        Raises:
            ValueError: a whole line that is not JSON, naming the file and the line.
        """
        records = []
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    records.append(json.loads(line))
                except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                    if _unclosed(line):
                        continue  # torn by a writer killed mid-line
                    raise ValueError(
                        f"{path}, line {n}: not a JSON record ({e}); the log was altered "
                        "there: delete that line to read the rest"
                    ) from e
        return records


def _record(raw: bytes) -> dict[str, Any] | None:
    """The record a line holds; None for a line that is not a JSON object."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class _Start:
    """What a ``FitStart`` says of where a run resumed."""

    step: int
    evaluated: bool
    position: int

    @classmethod
    def of(cls, start: FitStart | dict[str, Any]) -> _Start:
        if isinstance(start, FitStart):
            return cls(start.start_step, start.start_evaluated, start.start_position)
        step, position = _int(start.get("start_step")), _int(start.get("start_position"))
        return cls(step or 0, start.get("start_evaluated") is True, position or 0)

    def redoes(self, record: dict[str, Any], at: int) -> bool:
        """Whether a run resumed here logs again ``record``, of step ``at``."""
        if at != self.step:
            return at > self.step
        if record.get("event") == "Metrics":  # an evaluation the checkpoint does not hold
            return record.get("node") == "" and not self.evaluated
        return record.get("event") == "EpochEnd" and self.position > 0  # an epoch it was inside


@dataclass
class _Attempt:
    """One ``FitStart`` of the log and what follows it, up to the next."""

    offset: int  # of its FitStart line
    start: _Start
    first: int | None = None  # the step of its first StepEnd, and of its last
    last: int = 0
    end: int | None = None  # the step of its FitEnd, if it logged one

    def holds(self, step: int) -> bool:
        return self.first is not None and self.first <= step <= self.last


def _superseded(f: IO[bytes], start: _Start) -> tuple[int, bytearray | None] | None:
    """Where the run ``start`` resumes begins in the log ``f``, and whether each line from
    there is dropped (1) or kept (0) — None: all are. None for nothing to drop."""
    run = _run(_attempts(f))
    if start.step == 0:  # no checkpoint yet: an attempt begun afresh, killed before its first
        fresh = len(run) == 1 and run[0].start.step == 0 and run[0].end is None
        return (run[0].offset, None) if fresh else None
    if not any(a.holds(start.step) for a in run):  # not this run's log until now
        return None
    if any(a.end is not None and a.end > start.step for a in run):  # it ended past there
        return None
    f.seek(run[0].offset)
    drop = _dropped(f, run, start)
    return (run[0].offset, drop) if any(drop) else None


def _attempts(f: IO[bytes]) -> list[_Attempt]:
    """The attempts the log holds (its lines before the first ``FitStart`` are in none)."""
    attempts: list[_Attempt] = []
    offset = 0
    for raw in f:
        offset += len(raw)
        if not (b'"FitStart"' in raw or b'"StepEnd"' in raw or b'"FitEnd"' in raw):
            continue  # (parsed only where it may be one: a long log reads faster)
        record = _record(raw)
        event = record.get("event") if record is not None else None
        if record is not None and event == "FitStart":
            attempts.append(_Attempt(offset - len(raw), _Start.of(record)))
        elif attempts and event == "FitEnd" and record is not None:
            attempts[-1].end = _int(record.get("step")) or 0
        elif attempts and event == "StepEnd" and record is not None:
            a, step = attempts[-1], _int(record.get("step"))
            if step is not None:
                a.first = step if a.first is None else min(a.first, step)
                a.last = max(a.last, step)
    return attempts


def _run(attempts: list[_Attempt]) -> list[_Attempt]:
    """The attempts of the log's last run: its last attempt, and the one before each that
    resumed (``start_step`` > 0) a step an attempt before it logged — back to the run's
    attempt begun at step 0."""
    i = len(attempts) - 1
    while i > 0 and attempts[i].start.step > 0:
        step, j = attempts[i].start.step, i - 1
        while not attempts[j].holds(step) and attempts[j].start.step > 0 and j > 0:
            j -= 1
        if not attempts[j].holds(step):  # resumed a run logged elsewhere: not the one before
            break
        i -= 1
    return attempts[max(i, 0) :]


def _dropped(f: IO[bytes], run: list[_Attempt], start: _Start) -> bytearray:
    """Whether each line of ``run``'s attempts (``f`` at the first) is dropped: a record that
    a later attempt, or the run ``start`` resumes now, logs again."""
    starts = [a.start for a in run[1:]] + [start]  # the starts after each attempt
    bounds = [a.offset for a in run[1:]]
    drop, offset, k = bytearray(), run[0].offset, 0
    waiting: list[int] = []  # records without a step, since the last with one
    for raw in f:
        if k < len(bounds) and offset >= bounds[k]:  # the next attempt's FitStart
            drop, waiting, k = _settle(drop, waiting, True), [], k + 1
        offset += len(raw)
        record = _record(raw)
        if record is None:  # not JSON: a torn line (its attempt's last) goes, others stay
            drop.append(_unclosed(raw.strip()) or not raw.endswith(b"\n"))
            continue
        at = _int(record.get("start_step" if record.get("event") == "FitStart" else "step"))
        if at is None:  # decided by the next record with a step: it was logged on the way there
            waiting.append(len(drop))
            drop.append(False)
            continue
        gone = any(s.redoes(record, at) for s in starts[k:])
        drop, waiting = _settle(drop, waiting, gone), []
        drop.append(gone)
    return _settle(drop, waiting, True)  # (an attempt's last records: after its checkpoint)


def _settle(drop: bytearray, waiting: list[int], gone: bool) -> bytearray:
    for i in waiting:
        drop[i] = gone
    return drop


def _copy(src: IO[bytes], dst: IO[bytes], size: int) -> None:
    while size > 0:
        chunk = src.read(min(size, 1 << 20))
        if not chunk:
            break
        dst.write(chunk)
        size -= len(chunk)


def _unclosed(line: bytes) -> bool:
    """Whether ``line`` ends before the object it opens is closed: what a cut leaves of a
    record (a string left open, or more ``{``/``[`` than closed). A line that closes what
    it opens and still is not JSON was altered, not torn."""
    depth, in_string, escaped = 0, False, False
    for c in line:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in b"{[":
            depth += 1
        elif c in b"}]":
            depth -= 1
    return line.startswith(b"{") and (in_string or depth > 0)


def _torn_tail(fd: int) -> bool:
    """Whether the file open at ``fd`` ends inside a line (a writer killed mid-line)."""
    try:
        size = os.fstat(fd).st_size
        return size > 0 and pread(fd, 1, size - 1) != b"\n"
    except OSError:  # unreadable: write as before
        return False
