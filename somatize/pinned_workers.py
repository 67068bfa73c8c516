"""A Dask executor pinned to workers: noticing, while a slice waits, that its worker is gone.

Dask binds a task pinned by address or by name to the address that answered when it was
sent; a worker its nanny restarts comes back under its name at another address, and the
task would wait for the old one forever. ``ExecutorTransport`` looks at the cluster every
``POLL`` seconds while it waits, and fails the attempt once no worker that may take the
task has been there for ``LOST_AFTER`` seconds — a retry then reaches the restarted worker.
"""

from __future__ import annotations

__all__ = ["LOST_AFTER", "POLL", "PinnedWorkerGone", "all_gone", "bound", "pinned"]

POLL = 1.0  # seconds between looks at the cluster while a pinned slice runs
LOST_AFTER = 3.0  # how long every pinned worker must be missing before the slice is lost


class PinnedWorkerGone(Exception):
    def __init__(self, workers: list[str]) -> None:
        super().__init__(f"pinned worker(s) {workers} left the cluster")
        self.workers = workers


def pinned(executor: object) -> tuple[object, list[str]] | None:
    """(client, workers) for a Dask executor restricted to workers, else None."""
    client, kwargs = getattr(executor, "_client", None), getattr(executor, "_kwargs", None)
    if client is None or not isinstance(kwargs, dict) or kwargs.get("allow_other_workers"):
        return None
    workers = kwargs.get("workers")
    if not workers:
        return None
    return client, [workers] if isinstance(workers, str) else [str(w) for w in workers]


def _workers(client: object) -> list[tuple[str, str, str]] | None:
    """(address, name, host) of each worker of the cluster; None if the scheduler is
    unreachable."""
    try:
        info = client.scheduler_info()["workers"]  # type: ignore[attr-defined]
    except Exception:
        return None
    found = []
    for address, w in info.items():
        found.append((address, str(w.get("name")), address.split("://")[-1].rsplit(":", 1)[0]))
    return found


def bound(client: object, workers: list[str]) -> set[str]:
    """The addresses of the workers answering to ``workers`` by address or by name: Dask binds
    a task pinned so to them, and a worker a nanny restarts comes back at another address."""
    found = _workers(client) or []
    return {address for address, name, _ in found if address in workers or name in workers}


def all_gone(client: object, workers: list[str], bound: set[str]) -> bool:
    """Whether no worker can take the task: none of ``bound`` (the addresses it was bound to)
    is left and no worker answers to ``workers`` by host; with nothing bound, none answers to
    them at all (address, name or host)."""
    found = _workers(client)
    if found is None:  # the scheduler itself is unreachable: the future's own error will say
        return False
    for address, name, host in found:
        if address in bound or host in workers:  # (a host pin Dask keeps: any of its workers)
            return False
        if not bound and (address in workers or name in workers):
            return False
    return True
