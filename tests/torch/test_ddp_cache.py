"""Per-example memory under DDP: a keeper in each process's memory is warned of."""

from __future__ import annotations

import warnings

import pytest

from somatize import DiskKeeper, Graph, MemoryKeeper, TieredKeeper
from somatize.torch.ddp_cache import warn_private_rows
from tests.torch.test_integrity import Linear


def graph(keeper=None, per_example=True):
    g = Graph.somatize(Linear().with_id("enc"), keeper=keeper)
    g.freeze("enc")
    return g.cache("enc", per="example") if per_example else g.cache("enc")


@pytest.mark.parametrize("keeper", [None, MemoryKeeper()], ids=["default", "memory"])
def test_rows_cached_in_each_ranks_memory_are_warned_of_naming_the_fix(keeper):
    with pytest.warns(UserWarning, match=r"node 'enc' cached per example under DDP \(2 ranks\)"):
        warn_private_rows(graph(keeper), 2)
    with pytest.warns(UserWarning, match=r"1/4 of its rows.*keeper=DiskKeeper\(path\)"):
        warn_private_rows(graph(keeper), 4)


def test_a_shared_keeper_one_process_or_whole_batch_caching_is_not_warned_of(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_private_rows(graph(DiskKeeper(tmp_path / "a")), 2)
        warn_private_rows(graph(TieredKeeper(MemoryKeeper(), DiskKeeper(tmp_path / "b"))), 2)
        warn_private_rows(graph(), 1)
        warn_private_rows(graph(per_example=False), 2)
