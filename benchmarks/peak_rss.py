"""Resident memory of benchmark processes: one process's from ``/proc`` (now, or its peak),
and the peak of a process tree sampled every 50 ms (``bench_federated``, ``flower_round``)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path


def _rss_kib(field: str, pid: int) -> int:
    """A process's resident memory in KiB from ``/proc/PID/status`` (VmRSS now, VmHWM peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class PeakRSS:
    """The peak resident memory of this process and its descendants, sampled every 50 ms."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            for p in [self.proc, *self.proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):  # a process that just ended
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
