"""Where a warning raised inside somatize points: the user's line (``outside()``)."""

from __future__ import annotations

import os
import sys
from types import FrameType

__all__ = ["outside"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# the libraries somatize runs inside of: their frames sit between the user's line and
# somatize's (nn.Module.__call__ calling module(g)'s forward, Lightning's hooks calling
# LightningGraph's); found once imported, never imported here
_HOSTS = ("torch", "lightning", "pytorch_lightning")
_skipped: list[str] = [_PACKAGE]
_found: set[str] = set()


def _prefixes() -> tuple[str, ...]:
    if len(_found) < len(_HOSTS):
        for name in _HOSTS:
            module = sys.modules.get(name) if name not in _found else None
            path = getattr(module, "__file__", None)
            if path:
                _found.add(name)
                _skipped.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(_skipped)


def outside() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the caller of this function that
    names the first frame outside somatize and the libraries it runs inside of (torch,
    Lightning): a warning raised deep inside a fit (a watcher told of an event), or inside
    ``model(x)``, then points at the user's line that called into it."""
    skipped = _prefixes()
    frame: FrameType | None = sys._getframe(1)  # the caller, which warns: stacklevel 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level
