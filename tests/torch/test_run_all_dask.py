"""run_all on Dask's executor: repeats of one call are run once there, and it says so."""

from __future__ import annotations

import random
import warnings

import pytest

import somatize.torch as st


def draw(config: str) -> float:
    """An unseeded run: another number each time it runs."""
    return random.random()


@pytest.mark.slow
def test_run_all_warns_that_a_pure_dask_executor_runs_repeated_items_once():
    # found by an outside audit: five repeats of an unseeded run gave five copies of one
    # run (summarize: std 0), with nothing said
    distributed = pytest.importorskip("dask.distributed")
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            dashboard_address="127.0.0.1:0",  # a free port: 8787 may be taken
            # the scheduler's HTTP server would take port 8787, and warn if it is taken
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        with pytest.warns(UserWarning, match=r"items\[0\] and items\[1\].*pure=False") as w:
            runs = st.run_all(client.get_executor(), draw, ["cfg"] * 3)
        assert w[0].filename == __file__ and "2 repeat(s)" in str(w[0].message)
        assert len(set(runs.results)) == 1  # what it warns of: one run, three times
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            runs = st.run_all(client.get_executor(pure=False), draw, ["cfg"] * 3)
            assert len(set(runs.results)) == 3  # three runs
            st.run_all(client.get_executor(), draw, ["a", "b", "c"])  # no repeat: no warning
