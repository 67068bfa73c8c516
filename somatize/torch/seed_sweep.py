"""The sweep pitfall of ``Trainer(seed=)``: runs seeded only through the global generator.

A sweep ported from a plain PyTorch or Lightning loop seeds the global generator for each
run (``torch.manual_seed(s)``, Lightning's ``seed_everything(s)``) and leaves the Trainer's
``seed`` at its default. The fit seeds the generators itself from ``Trainer(seed=0)``, so
the runs share their batch order, dropout masks and augmentation; only the initial weights
differ, and intervals over them (``st.summarize``, ``st.compare``) come out too narrow.

``check_global_seed`` warns, once per line of code, when a fit of a Trainer whose ``seed``
was not given finds torch's global seed (``torch.initial_seed()``) other than at the
previous such fit from the same line — the loop above, not one fit per test or script —
or finds Lightning's ``seed_everything(s)`` (``PL_GLOBAL_SEED``, still torch's seed) with
another seed than the Trainer's. An explicit ``seed=`` never warns, nor does a fit that
starts while another runs (a smoke run's inner fit; one in another thread, whose seed the
global generator then holds).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

import torch

from ..stack import outside
from .rng import in_fit

__all__ = ["DEFAULT_SEED", "check_global_seed", "forget_sites"]


class _Default(int):
    """The default ``Trainer(seed=)``: 0, marked as not given (``seed=0`` given is a plain
    int). Only its identity is read; the Trainer keeps ``int(seed)``."""

    __slots__ = ()


DEFAULT_SEED: int = _Default(0)

_lock = threading.Lock()
_sites: dict[tuple[str, int], int] = {}  # a fit's line -> torch's seed at its last fit there
_last = [-1]  # torch's seed at the last fit judged, wherever it was (the common case: the same)
_warned: set[tuple[str, int]] = set()


def forget_sites() -> None:
    """Forget the fits seen so far (tests start from none)."""
    with _lock:
        _sites.clear()
        _warned.clear()
        _last[0] = -1


def check_global_seed(trainer: Any) -> None:
    """Warn when a fit of ``trainer`` (its ``seed`` not given) looks like one run of a sweep
    seeded through the global generator; see the module's docstring. Called as ``fit``
    starts, before it seeds anything."""
    if in_fit() or getattr(trainer, "_seed_given", True) or trainer.seed != 0:
        return
    now = torch.initial_seed()
    lightning = os.environ.get("PL_GLOBAL_SEED")
    if now == _last[0] and lightning is None:  # (no line's seed moved since: ~1 µs, not ~9)
        return
    _last[0] = now
    level = outside()
    try:
        frame = sys._getframe(level - 1)  # (stacklevel 1 is this function's own frame)
    except ValueError:  # no frame outside somatize and torch: no user's line to judge
        return
    site = (frame.f_code.co_filename, frame.f_lineno)
    with _lock:
        before = _sites.get(site)
        _sites[site] = now
        if site in _warned:
            return
        if lightning is not None and lightning != "0" and lightning == str(now):
            why = (
                f"Lightning's seed_everything({lightning}) seeded the global generators, "
                "but fit seeds them again from the Trainer's seed=0 as it starts (and "
                "gives yours back when it ends): this run's batch order, dropout masks "
                f"and augmentation follow seed=0, not {lightning}; only the initial weights "
                f"drawn before fit follow {lightning}"
            )
        elif before is not None and before != now:
            why = (
                f"torch's global seed was {before} at the previous fit from this line and is "
                f"{now} now (torch.manual_seed, Lightning's seed_everything), but the "
                "Trainer was given no seed=, so both fits train with seed=0: runs that "
                "differ only by the global seed share their batch order, dropout masks and "
                "augmentation (fit seeds the generators itself as it starts); only the "
                "initial weights differ, and st.summarize/st.compare intervals over them "
                "come out too narrow"
            )
        else:
            return
        _warned.add(site)
    warnings.warn(
        f"{why}. Pass the run's seed to the Trainer too, st.Trainer(..., seed=s), as "
        "docs/campaigns.md's train_one_seed does; or seed=0 to train every run in one order "
        "on purpose (either silences this)",
        UserWarning,
        stacklevel=level,
    )
