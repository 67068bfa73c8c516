"""A watcher writing a run as a CSV table: one row per step, per evaluation and per epoch.

``every_steps=N`` writes every Nth step's row only (Lightning's ``log_every_n_steps``).

Columns: ``kind`` (``step``, ``eval`` or ``epoch``), ``step``, ``epoch``, then ``loss``,
``lr`` (and ``lr/group<i>`` for each parameter group after the first), ``examples``,
``seconds`` on step rows (and ``grad_norm``, from the first step that tells it:
``Options(clip_grad_norm=)`` or ``log_grad_norm=True``; a column per term of a loss
function's dict, ``recon``, ``kl``: ``StepEnd.terms``), node metrics as ``<node>/<name>`` on the
step they were computed in, and the evaluation's values (``val_loss``, ``val_acc``...) on
eval rows. An epoch row after each epoch holds its mean training loss, ``epoch_loss``
(``EpochEnd.loss``, Lightning's ``train_loss_epoch``), ``epoch_<term>`` for each term,
and ``epoch_<node>/<name>`` for each node metric (its epoch's mean: ``EpochEnd.node_metrics``);
when the graph remembers a node, what its cache found: ``cache/<node>/hits`` and
``cache/<node>/misses`` (``EpochEnd.cache``).
``pandas.read_csv(path)`` reads it as it is. Under DDP rank 0 writes, and a step's
``loss`` and ``examples`` are over all ranks as ``StepEnd`` says.

Each row is one ``write`` to a file opened for appending, so a process killed at any
instant leaves whole rows; when a new column appears (the first evaluation) the file
is read back and rewritten atomically under the wider header (no row is held in memory,
however long the run). A step's row waits for its node metrics,
and goes to disk before a checkpoint is written (the Trainer calls ``flush()``), so a
resumed run drops the rows the interrupted one wrote after its checkpoint, and only
those. A damaged row (a step that is not a number) is dropped with a warning; a log
whose header is damaged is set aside as ``<name>.damaged`` and started anew. A path
that is not a regular file (``os.devnull``, a named pipe another program reads) is
written as a stream: the header, the rows, and the header again when columns appear;
never read back, set aside or renamed over.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
import warnings
from pathlib import Path
from typing import Any

from ..keepers import atomic_write
from ..platforms import BINARY
from ..stack import outside
from ..watchers import EpochEnd, Event, FitEnd, FitStart, Metrics, StepEnd
from .ported import ported
from .settings import count

__all__ = ["CSVLog"]

_FIRST = ["kind", "step", "epoch", "loss", "lr", "examples", "seconds"]


class CSVLog:
    """Writes a run to ``path`` as CSV (one row per step, per evaluation and per epoch).

    Args:
        path: the CSV file (its directory is created). A fresh run replaces it.
        every_steps: write a step's row every N steps, with its node metrics (Lightning's
            ``log_every_n_steps``); evaluation and epoch rows are always written.

    Example:
        >>> st.Trainer(..., watchers=[st.CSVLog("runs/digits/log.csv")])  # doctest: +SKIP
        >>> pandas.read_csv("runs/digits/log.csv").query("kind == 'eval'")  # doctest: +SKIP
    """

    # a class default: __del__ runs on an object whose __init__ never did (a keyword it
    # does not take, CSVLog(path, log_every_n_steps=5)), and said AttributeError
    _fd: int | None = None

    def __init__(self, path: str | os.PathLike[str], *, every_steps: int = 1) -> None:
        self._fd = None  # (first: __del__ reads it)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"CSVLog takes the path of the CSV file to write, not {path!r}; e.g. "
                "st.CSVLog('runs/metrics.csv')"
            )
        self.path = Path(path)
        if self.path.is_dir():  # (before: an IsADirectoryError naming a temp file, at fit)
            raise IsADirectoryError(
                errno.EISDIR,
                f"CSVLog takes the path of a CSV file, and {self.path} is a directory; pass a "
                f"file in it, e.g. st.CSVLog({str(self.path / 'metrics.csv')!r})",
            )
        # a device or a pipe (os.devnull, a FIFO read by another program): written as a
        # stream, never read back, moved aside or renamed over (as root, the atomic rewrite
        # replaced /dev/null itself with a file)
        self._stream = self.path.exists() and not self.path.is_file()
        count("CSVLog every_steps", every_steps, hint="e.g. st.CSVLog(path, every_steps=50)")
        self.every_steps = every_steps
        self._columns: list[str] = list(_FIRST)
        self._pending: dict[str, Any] | None = None
        self._epoch = 0

    def on_event(self, event: Event) -> None:
        if isinstance(event, StepEnd):
            self._finish()
            self._epoch = event.epoch
            if event.step % self.every_steps:  # (its node metrics find no row: not written)
                return
            self._pending = {
                "kind": "step",
                "step": event.step,
                "epoch": event.epoch,
                "loss": event.loss,
                "lr": event.lr,
                "examples": event.examples,
                "seconds": event.seconds,
                **{f"lr/group{i}": lr for i, lr in enumerate(event.lrs[1:], 1)},
            }
            if event.grad_norm is not None:  # a column of its own: a log without it is as before
                self._pending["grad_norm"] = event.grad_norm
            if event.terms:  # a loss function's terms: a column each, as grad_norm's
                self._pending.update(event.terms)
        elif isinstance(event, Metrics):
            values = {k: _number(v) for k, v in event.values.items()}
            if event.node:  # a node's metrics of the step just reported
                if self._pending is not None and self._pending["step"] == event.step:
                    self._pending.update({f"{event.node}/{k}": v for k, v in values.items()})
                return
            self._finish()
            self._write({"kind": "eval", "step": event.step, "epoch": self._epoch, **values})
        elif isinstance(event, FitStart):
            self._start(event)
        elif isinstance(event, EpochEnd):
            self._finish()
            row: dict[str, Any] = {"kind": "epoch", "step": event.step, "epoch": event.epoch}
            if event.loss is not None:  # the epoch's mean: columns of its own, not "loss"
                row["epoch_loss"] = event.loss
                row.update({f"epoch_{name}": v for name, v in event.terms.items()})
            for node, means in event.node_metrics.items():  # its node metrics' means
                row.update({f"epoch_{node}/{name}": v for name, v in means.items()})
            for node, c in event.cache.items():  # what the cached nodes found in the epoch
                row[f"cache/{node}/hits"], row[f"cache/{node}/misses"] = c["hits"], c["misses"]
            if len(row) > 3:
                self._write(row)
        elif isinstance(event, FitEnd):
            self._finish()

    def _start(self, event: FitStart) -> None:
        self._columns, self._pending = list(_FIRST), None
        start_step, rows = event.start_step, []
        if (
            start_step and self.path.exists() and not self._stream
        ):  # resumed: keep what led up to the checkpoint
            rows = [row for row in self._read(start_step) if not _redone(row, event)]
        self._rewrite(rows)

    def _read(self, start_step: int | None) -> list[dict[str, Any]]:
        """The rows of the log up to ``start_step`` (None: all), damaged ones dropped with
        a warning; its columns become this log's."""
        text = self.path.read_bytes().decode("utf-8", errors="replace").replace("\0", "")
        # Every row ends in a newline: a last one without is what a kill left of a row
        # (cut anywhere: "step,1" of step 12's), never read as one.
        if "\n" in text:
            text = text[: text.rfind("\n") + 1]
        reader = csv.DictReader(io.StringIO(text, newline=""))
        columns = list(reader.fieldnames or [])
        if columns[:3] != _FIRST[:3]:
            aside = self.path.with_name(self.path.name + ".damaged")
            os.replace(self.path, aside)
            warnings.warn(
                f"CSVLog: the header of {self.path} is damaged ({columns[:3]}, not {_FIRST[:3]}); "
                f"it was moved to {aside} and the log starts anew"
                f"{f' from step {start_step}' if start_step is not None else ''}. Its rows are "
                "readable there by hand",
                UserWarning,
                stacklevel=outside(),
            )
            return []
        self._columns = columns
        rows, damaged = [], []
        for row in reader:
            try:
                step = int(row.get("step") or "")
            except ValueError:
                damaged.append(reader.line_num)
                continue
            if start_step is None or step <= start_step:
                row.pop(None, None)  # (fields past the header's: DictWriter refuses them)
                rows.append(row)
        if damaged:
            warnings.warn(
                f"CSVLog: {len(damaged)} damaged row(s) of {self.path} (line(s) "
                f"{', '.join(map(str, damaged[:5]))}{'…' if len(damaged) > 5 else ''}: a step "
                "that is not a number) were dropped; the run goes on with the others",
                UserWarning,
                stacklevel=outside(),
            )
        return rows

    def flush(self) -> None:
        """Write the row still open: a checkpoint is about to cover its step."""
        self._finish()

    def _finish(self) -> None:
        if self._pending is not None:
            row, self._pending = self._pending, None
            self._write(row)

    def _write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self._columns]
        if new:  # the rows are read back from the file: a long run's are not held in memory
            rows = self._read(None) if self.path.exists() and not self._stream else []
            self._columns.extend(k for k in new if k not in self._columns)
            self._rewrite([*rows, row])
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | BINARY, 0o666)
        line = self._lines([row]).encode()
        written = os.write(self._fd, line)
        if written != len(line):  # (a full disk) the torn row goes: the next is not joined to it
            with contextlib.suppress(OSError):
                os.truncate(self._fd, os.fstat(self._fd).st_size - written)
            raise OSError(
                errno.ENOSPC,
                f"CSVLog: wrote {written} of the {len(line)} bytes of a row to {self.path} "
                "(is the disk full?); the torn row was cut off again",
            )

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        if self._stream:  # the header again, then the rows: its reader sees the new columns
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | BINARY)
            os.write(self._fd, self._lines(rows, header=True).encode())
            return
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, self._lines(rows, header=True).encode())

    def _lines(self, rows: list[dict[str, Any]], header: bool = False) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, self._columns, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()

    def close(self) -> None:
        """Write the row still open (the Trainer closes its watchers when a run fails too)."""
        if self._pending is not None:
            self._finish()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process opens its own file
        return {**self.__dict__, "_fd": None}


def _number(value: Any) -> Any:
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _redone(row: dict[str, Any], start: FitStart) -> bool:
    """Whether the resumed run writes ``row`` again: an evaluation at its start step that
    its checkpoint does not hold (written after it, before the process died), or the
    end of an epoch the checkpoint was written inside of."""
    if int(row["step"]) != start.start_step:
        return False
    kind = row.get("kind")
    return (kind == "eval" and not start.start_evaluated) or (
        kind == "epoch" and start.start_position > 0
    )


CSVLog.__init__ = ported("CSVLog")(CSVLog.__init__)  # type: ignore[method-assign]
