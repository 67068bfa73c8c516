"""Where a warning raised inside somatize points: the user's line (``outside()``)."""

from __future__ import annotations

import os
import sys
from types import FrameType

__all__ = ["outside"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def outside() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the caller of this function that
    names the first frame outside somatize: a warning raised deep inside a fit (a watcher
    told of an event) then points at the user's line that called into it."""
    frame: FrameType | None = sys._getframe(1)  # the caller, which warns: stacklevel 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
