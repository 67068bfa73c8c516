"""``paused_gc``: no full collection while a build allocates, young ones go on, and the
collector's settings come back (also on error, and when the caller had disabled it)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from somatize.bulk import paused_gc


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection that starts while the test runs."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)


def test_a_build_triggers_young_collections_but_no_full_one(collections: list[int]) -> None:
    before = gc.get_threshold()
    gc.collect()
    collections.clear()
    with paused_gc():
        kept = [[i] for i in range(200_000)]  # far past every threshold: 200,000 tracked lists
    assert len(kept) == 200_000
    assert collections and 2 not in collections  # young (and middle) ones ran, never a full one
    assert 0 in collections
    assert gc.get_threshold() == before and gc.isenabled()


def test_the_thresholds_come_back_after_an_error_and_nesting() -> None:
    before = gc.get_threshold()
    with pytest.raises(KeyError), paused_gc():
        with paused_gc():
            assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > before[2]
        raise KeyError("boom")
    assert gc.get_threshold() == before and gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled(collections: list[int]) -> None:
    gc.disable()
    try:
        before = gc.get_threshold()
        with paused_gc():
            kept = [[i] for i in range(20_000)]
        assert len(kept) == 20_000 and collections == []
        assert not gc.isenabled() and gc.get_threshold() == before
    finally:
        gc.enable()
