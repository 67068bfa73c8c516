"""Every RNG state a run draws from (python, numpy, torch, CUDA), as tensors and ints, so a
checkpoint holding them loads with ``weights_only=True``; and putting them back."""

from __future__ import annotations

import contextlib
import random
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from ..stack import outside
from .rng_numpy import get_numpy, set_numpy

__all__ = [
    "as_state",
    "in_fit",
    "own_generators",
    "put_back",
    "restore_rank_rng",
    "rng_state",
    "set_rng_state",
    "snapshot",
]


def restore_rank_rng(payload: dict[str, Any], rank: int, world: int) -> None:
    """Under DDP, put this rank's own RNG states back (a checkpoint holds every rank's as
    ``rngs``; ``rng`` is rank 0's, which a checkpoint of another world size falls back to)."""
    rngs = payload.get("rngs")
    if world > 1 and rngs is not None and len(rngs) == world:
        set_rng_state(rngs[rank])


def rng_state() -> dict[str, Any]:
    """Every RNG state as tensors and ints (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    with contextlib.suppress(ImportError):
        import numpy as np

        kind, keys, pos, has_gauss, cached = get_numpy(np)
        keys = np.asarray(keys, dtype="int64")
        state["numpy"] = [kind, torch.from_numpy(keys), pos, has_gauss, cached]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal.tolist()), gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        set_numpy(np, (kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def snapshot() -> tuple[Any, ...]:
    """Every RNG state as the generators give it, not yet made tensors: a fraction of what
    ``rng_state`` costs (numpy's words copied as a block, ``rng_numpy``) (the loop takes one each epoch; ``as_state`` converts it when a
    checkpoint is written)."""
    np = _numpy()
    return (
        random.getstate(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        get_numpy(np) if np is not None else None,
    )


def put_back(state: Any) -> None:
    """Restore a ``snapshot()``, or a checkpoint's ``rng_state()`` dict."""
    if isinstance(state, dict):
        set_rng_state(state)
        return
    python, cpu, cuda, numpy_state = state
    random.setstate(python)
    torch.set_rng_state(cpu)
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    np = _numpy()
    if numpy_state is not None and np is not None:
        set_numpy(np, numpy_state)


def as_state(state: Any) -> dict[str, Any] | None:
    """A ``snapshot()`` as ``rng_state()`` makes it (tensors and ints, for a checkpoint);
    a dict or None as it is."""
    if state is None or isinstance(state, dict):
        return state
    python, cpu, cuda, numpy_state = state
    version, internal, gauss = python
    out: dict[str, Any] = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
        "torch": cpu,
        "cuda": cuda,
    }
    np = _numpy()
    if numpy_state is not None and np is not None:
        kind, keys, pos, has_gauss, cached = numpy_state
        out["numpy"] = [
            kind,
            torch.from_numpy(np.asarray(keys, dtype="int64")),
            pos,
            has_gauss,
            cached,
        ]
    return out


def _numpy() -> Any:
    try:
        import numpy as np
    except ImportError:
        return None
    return np


_fits = [0]  # threads in a fit in this process now
_fits_lock = threading.Lock()
_in_fit = threading.local()  # this thread's depth (a smoke run's fit runs inside its fit)


def in_fit() -> bool:
    """Whether a fit runs in this process now: in this thread (a smoke run's fit runs
    inside its fit) or in another (whose seeding the global generators then hold)."""
    return getattr(_in_fit, "depth", 0) > 0 or _fits[0] > 0


@contextlib.contextmanager
def own_generators() -> Iterator[None]:
    """Around a fit: the global generators (Python's, numpy's, torch's) are given back as
    the caller left them when it ends, however it ends — the fit seeds them for itself, and
    code after it (the next model's initial weights) draws as if it had not run, not the
    same numbers after every fit. And a fit that starts while another thread is in one (a
    ``ThreadPoolExecutor``) warns that both draw from torch's and Python's global
    generators — dropout, shuffling, augmentation — so neither is reproducible from its
    seed; processes each have their own."""
    depth = getattr(_in_fit, "depth", 0)  # (> 0: a fit inside this thread's own fit)
    _in_fit.depth = depth + 1
    callers = snapshot()  # given back when the fit ends: it seeds the generators for itself
    try:
        if not depth:
            with _fits_lock:
                _fits[0] += 1
                others = _fits[0] - 1
            if others:
                warnings.warn(
                    f"this fit starts while {others} other(s) run in this process (threads, "
                    "e.g. a ThreadPoolExecutor): they draw from the same global generators "
                    "(torch's and Python's: dropout, shuffling, augmentation), so no run is "
                    "reproducible from its seed; run them in processes, "
                    "st.executor(workers=N), or one after another",
                    RuntimeWarning,
                    stacklevel=outside(),
                )
        yield
    finally:
        put_back(callers)
        _in_fit.depth = depth
        if not depth:
            with _fits_lock:
                _fits[0] -= 1
