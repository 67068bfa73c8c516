"""``rng_numpy``: numpy's legacy global state read and put back through its memory is what
``np.random.get_state``/``set_state`` read and write — the words, the position, the gaussian
held or not — and reading it moves nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from somatize.torch import rng_numpy
from somatize.torch.rng_numpy import get_numpy, set_numpy

# states to read: seeded, a gaussian held (one of a pair used), none held again, the
# position just past a refill of the 624 words, at its end
STATES: list[Callable[[], Any]] = [
    lambda: np.random.seed(1),
    lambda: (np.random.seed(2), np.random.standard_normal()),
    lambda: (np.random.seed(3), np.random.standard_normal(4)),
    lambda: (np.random.seed(4), np.random.random(700)),
    lambda: (np.random.seed(5), np.random.randint(0, 10, 311), np.random.standard_normal(3)),
]


def same(a: Any, b: Any) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])


def draws() -> list[float]:
    return [float(np.random.standard_normal()) for _ in range(3)] + list(np.random.rand(700))


@pytest.fixture(params=["memory", "get_state"])
def path(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "get_state":  # (where the check found the memory path unsafe)
        monkeypatch.setattr(rng_numpy, "_checked", [np.random.mtrand._rand, None])
    return str(request.param)


def test_the_memory_path_is_taken_here() -> None:
    assert rng_numpy._where(np)[1] is not None  # numpy's MT19937 here: the check passed


@pytest.mark.parametrize("state", range(len(STATES)))
def test_get_numpy_is_get_state_and_moves_nothing(state: int, path: str) -> None:
    STATES[state]()
    expected = np.random.get_state(legacy=True)
    got = get_numpy(np)
    assert same(got, expected)
    assert same(np.random.get_state(legacy=True), expected)  # the read drew nothing
    after = draws()
    np.random.set_state(expected)
    assert draws() == after


@pytest.mark.parametrize("state", range(len(STATES)))
def test_set_numpy_puts_back_exactly_what_set_state_would(state: int, path: str) -> None:
    STATES[state]()
    kept = get_numpy(np)
    expected = np.random.get_state(legacy=True)
    wanted = draws()
    for moved in (lambda: np.random.standard_normal(), lambda: np.random.random(1000)):
        moved()  # (a gaussian left held, or none: the writer clears it first)
        set_numpy(np, kept)
        assert same(np.random.get_state(legacy=True), expected)
        assert draws() == wanted


def test_set_numpy_takes_a_state_of_get_state_with_a_gaussian_value_not_held() -> None:
    np.random.seed(7)
    words = np.random.get_state(legacy=True)[1]
    odd = ("MT19937", words, 5, 0, 2.5)  # (only set_state writes a value not held)
    set_numpy(np, odd)
    assert same(np.random.get_state(legacy=True), odd)
