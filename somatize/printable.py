"""Text read from disk, made safe to print to a terminal.

A file name or a record field comes from whoever wrote the directory: printed as it is,
a control character in it (``ESC``, ``CSI``) is an escape sequence the terminal obeys —
a retitled window, a rewritten line, a forged one. The commands print such text through
``printable``, which writes each control character as its Python escape.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 (a tab kept), DEL, C1


def printable(text: object) -> str:
    """``str(text)`` with each control character written as its escape (``\\x1b``).

    Example:
        >>> printable("step-000000001.ckpt\\x1b]0;pwned\\x07")
        'step-000000001.ckpt\\\\x1b]0;pwned\\\\x07'
    """
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))
