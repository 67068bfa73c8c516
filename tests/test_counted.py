"""Counts in messages, in the right number (somatize/counted.py)."""

from __future__ import annotations

import pytest

from somatize.counted import counted


@pytest.mark.parametrize(
    ("n", "noun", "nouns", "expected"),
    [
        (1, "entry", None, "1 entry"),
        (0, "entry", None, "0 entries"),
        (2, "corrupt entry", None, "2 corrupt entries"),
        (1, "byte", None, "1 byte"),
        (1024, "byte", None, "1024 bytes"),
        (2, "key", None, "2 keys"),  # -y after a vowel: only an s
        (2, "run", None, "2 runs"),
        (2, "directory", "directories", "2 directories"),
        (3, "child", "children", "3 children"),
        (1, "child", "children", "1 child"),
    ],
)
def test_counted_is_singular_for_one_and_plural_otherwise(
    n: int, noun: str, nouns: str | None, expected: str
) -> None:
    assert counted(n, noun, nouns) == expected
