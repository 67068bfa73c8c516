"""``JsonLines``: the core's run log, one JSON object per event, appended to a file."""

from __future__ import annotations

import errno
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from .platforms import BINARY, pread
from .watchers import Event, NodeEnd, NodeStart

__all__ = ["JsonLines"]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, bool)) or value is None:
        return value
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

    Args:
        path: the log file (its directory is created).
        nodes: also log ``NodeStart``/``NodeEnd`` (verbose; off by default).
    """

    def __init__(self, path: str | os.PathLike[str], *, nodes: bool = False) -> None:
        self._fd: int | None = None  # first: __del__ runs even if the mkdir below fails
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
