"""Counts in messages, in the right number: ``counted(1, "entry")`` is ``"1 entry"``,
``counted(2, "entry")`` is ``"2 entries"``."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun``, singular for 1 and plural otherwise (``0 entries``).

    The plural is ``nouns`` if given; else ``noun`` with ``-y`` after a consonant made
    ``-ies`` (``entry``), or with ``s`` added (``byte``, ``run``).

    Example:
        >>> counted(1, "entry"), counted(3, "corrupt entry"), counted(2, "pack")
        ('1 entry', '3 corrupt entries', '2 packs')
    """
    if n == 1:
        return f"{n} {noun}"
    if nouns is None:
        vowel = len(noun) > 1 and noun[-2] in "aeiou"
        nouns = noun[:-1] + "ies" if noun.endswith("y") and not vowel else noun + "s"
    return f"{n} {nouns}"
