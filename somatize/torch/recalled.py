"""A remembered run read back instead of trained: one line saying so, and ``forget``.

A recall trains nothing and returns at once. A user who changed something its key does
not see (a file read by path, an environment variable) would otherwise be left asking
why "training took 0 s". ``tell`` logs one INFO record on the ``somatize.remember``
logger naming the call, the run's key and how to train it again; where logging is not
set up (no handler on the logger's way to the root) it is written to standard error
instead when that is a terminal or a notebook — where a fit's progress bar would show
(``Options(progress=None)``) — and nowhere otherwise (a script's log, a test). ``forget``
removes the run so that the next call trains it again.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ..errors import KeeperError
from ..runkey import CallKey
from ..runs import RunStore, unless_busy

__all__ = ["forget", "log", "tell"]

log = logging.getLogger("somatize.remember")


def _shown(stream: Any) -> bool:
    """Whether a line on ``stream`` is seen as it runs: a terminal or a Jupyter kernel's
    output (as the progress bar's default decides)."""
    isatty = getattr(stream, "isatty", None)
    try:
        if callable(isatty) and isatty():
            return True
    except (ValueError, OSError):  # a closed or detached stream
        return False
    return type(stream).__module__.startswith("ipykernel")


def _call(ck: CallKey) -> str:
    name = ck.function.rsplit(".", 1)[-1]
    return f"{name}({', '.join(f'{k}={v}' for k, v in ck.summary.items())})"


def tell(ck: CallKey, result: Any) -> None:
    """Say that the call ``ck`` was recalled (``result``: the stored run) — see the module."""
    steps, seconds = getattr(result, "steps", 0), getattr(result, "seconds", 0.0)
    text = (
        f"{_call(ck)}: recalled the finished run {ck.key[:12]} ({steps} steps, trained in "
        f"{seconds:.1f} s before); nothing was trained now. Its key holds the function's "
        "code, its helpers and its arguments, not what it reads from files or the "
        "environment: to train it again, call the remembered function's .forget() with the "
        "same arguments first (.explain() says what the key holds)"
    )
    if log.hasHandlers():  # logging is set up: its handlers and levels decide
        log.info(text)
    elif _shown(sys.stderr):  # where a progress bar would show; nowhere otherwise
        print(f"somatize: {text}", file=sys.stderr, flush=True)


def forget(store: RunStore, key: str, keeper: Any) -> bool:
    """Remove run ``key`` (its record, checkpoints and result in ``keeper``) so the next call
    trains it again; False when there was none.

    Raises:
        KeeperError: the run is being computed now (its lock is held).
    """
    with unless_busy(store, key) as free:
        if not free:
            raise KeeperError(
                f"run {key[:12]} is being computed now (its lock is held, in "
                f"{store.dir(key)}): forget it once that call has finished"
            )
        return store.remove(key, keeper)
