"""What the keeper tests share (tests/test_keepers*.py): ``k(i)``, a valid content key."""

from __future__ import annotations


def k(i: int) -> str:
    return f"{i:064x}"
