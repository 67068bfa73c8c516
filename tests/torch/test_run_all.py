"""``st.run_all`` (``somatize/torch/run_all.py``) on a plain process pool whose worker dies."""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor

import pytest

import somatize.torch as st


def die_at_two(i: int) -> int:
    if i == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


@pytest.mark.slow
def test_runs_a_broken_plain_pool_lost_say_why_and_what_re_runs_them():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = st.run_all(pool, die_at_two, range(4))
    assert runs.results[:2] == [0, 1] and set(runs.lost) == {2, 3}
    for why in runs.lost.values():
        assert why.startswith("BrokenProcessPool")
        assert "fails every run not finished" in why and "st.executor(workers=...)" in why
