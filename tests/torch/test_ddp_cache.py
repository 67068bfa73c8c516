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


def nested(keeper=None):
    inner = Graph.somatize(Linear().with_id("a")).freeze("a").cache("a", per="example")
    return Graph.somatize(inner.with_id("enc"), keeper=keeper).freeze("enc")


def test_rows_cached_per_example_inside_a_subgraph_are_warned_of_by_their_path(tmp_path):
    # the subgraph's node uses the outer graph's keeper: a default one hit about half its
    # rows on 2 ranks (digits, 3 epochs: 2240 hits of 5394 lookups), silently before
    with pytest.warns(UserWarning, match=r"node 'enc/a' cached per example under DDP"):
        warn_private_rows(nested(), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_private_rows(nested(DiskKeeper(tmp_path)), 2)


def test_a_tiered_keeper_of_two_memories_is_warned_of():
    private = TieredKeeper(MemoryKeeper(), MemoryKeeper())
    with pytest.warns(UserWarning, match=r"node 'enc' .*in the second epoch"):
        warn_private_rows(graph(private), 2)
