"""Where a warm batch of a node cached per example spends its time (``bench_memory``).

One epoch is run with the steps of ``somatize.rows.remember`` wrapped in a timer (the
wall clock's ``perf_counter_ns``: one thread, and a fraction of a µs per reading), in the
epoch itself rather than in a loop of its own, so each step meets the caches as a real
epoch leaves them. The wrappers are removed afterwards, also on error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import somatize.rows as rows
from somatize.memory import NodeKeys

#: (what owns it, its name, the label printed): the steps of a batch that hits
STEPS = (
    (rows, "_keys", "row keys"),
    (rows, "get_many", "keeper lookup"),
    (rows, "_recall", "entry checks"),
    (rows.Layout, "build", "assembly"),
    (NodeKeys, "parts", "the frozen node's state"),
    (rows, "remember", "all"),
)


@contextlib.contextmanager
def _timed(spent: dict[str, int]) -> Iterator[None]:
    real = [(owner, name, getattr(owner, name)) for owner, name, _ in STEPS]
    labels = {name: label for _, name, label in STEPS}

    def wrap(f: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0) + time.perf_counter_ns() - start

        return timed

    try:
        for owner, name, f in real:
            setattr(owner, name, wrap(f, labels[name]))
        yield
    finally:
        for owner, name, f in real:
            setattr(owner, name, f)


def breakdown(epoch: Callable[[], Any], batches: int) -> str:
    """µs per batch of each step over one ``epoch()``, and what the rest of the cached
    node's path took (``remember`` less its steps), as a phrase for a row's note."""
    spent: dict[str, int] = {}
    with _timed(spent):
        epoch()
    per = {label: ns / batches / 1e3 for label, ns in spent.items()}
    total = per.pop("all", 0.0)
    parts = [f"{label} {per.get(label, 0.0):.0f}" for _, _, label in STEPS[:-1]]
    rest = total - sum(per.values())
    return f"{', '.join(parts)}, the rest {rest:.0f} (of {total:.0f} µs per batch)"
