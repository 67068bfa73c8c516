"""``rng.snapshot`` / ``put_back``: every global generator comes back exactly as it was —
numpy's legacy state with the gaussian it holds (the second of a pair, which draws no word
when returned), Python's with its own — however far the generators moved meanwhile.
(Generators the data holds for itself: ``test_held_rng.py``.)"""

from __future__ import annotations

import random

import numpy as np
import torch

from somatize.torch.rng import put_back, snapshot


def draws() -> tuple[float, ...]:
    return (
        float(np.random.standard_normal()),  # the gaussian held from the pair drawn before
        float(np.random.standard_normal()),
        float(np.random.rand()),
        random.gauss(0, 1),
        random.random(),
        torch.rand(()).item(),
    )


def test_put_back_restores_every_generator_with_the_gaussians_they_hold():
    np.random.seed(3)
    np.random.standard_normal()  # draws a pair, returns one, holds the other
    random.seed(3)
    random.gauss(0, 1)  # (Python's gauss holds the second of its pair too)
    torch.manual_seed(3)
    held = np.random.get_state(legacy=True)
    assert held[3] == 1  # (has_gauss: what the test is about)
    kept = snapshot()
    expected = draws()
    for _ in range(2):  # (a snapshot is put back as often as asked, unchanged by it)
        np.random.seed(5)
        random.seed(5)
        torch.manual_seed(5)
        draws()
        put_back(kept)
        now = np.random.get_state(legacy=True)
        assert now[0] == held[0] and np.array_equal(now[1], held[1])
        assert now[2:] == held[2:]
        assert draws() == expected
