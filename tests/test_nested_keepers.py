"""A nested graph's own keeper is passed over (the outer graph's serves its nodes): warned of
once, naming the subgraph, its keeper, its remembered nodes and the fix."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from somatize import Ctx, DiskKeeper, Done, Graph, MemoryKeeper, Node
from somatize.transports import InProcess


class Inc(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + 1)


class Double(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x * 2)


def inner(keeper: Any = None) -> Graph:
    return Graph.somatize(Inc() >> Double(), keeper=keeper).cache("inc")


@contextmanager
def quiet() -> Iterator[None]:
    """A block in which any warning is an error (as pytest's filterwarnings=error is)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def entries(keeper: Any) -> int:
    return int(keeper.stats().entries)


def test_a_nested_graphs_own_disk_keeper_is_warned_of_naming_it_its_nodes_and_the_fix(
    tmp_path: Path,
) -> None:
    disk = DiskKeeper(tmp_path)
    g = Graph.somatize(inner(disk).with_id("enc") >> Inc())
    with pytest.warns(UserWarning) as caught:
        assert g.forward(3) == 9
    (w,) = caught
    text = str(w.message)
    assert text.startswith(f"subgraph 'enc' has its own keeper, {disk!r}, which is not used")
    assert "node 'enc/inc' keeps its entries in the outer graph's keeper (a MemoryKeeper" in text
    assert "g.keeper = g['enc'].keeper" in text and "g['enc'].keeper = None" in text
    assert w.filename == __file__  # (the user's line: g.forward)
    # what it says: the entry went to the outer graph's keeper, none to the disk
    assert entries(disk) == 0 and entries(g.keeper) == 1
    with quiet():  # once: not again on the next run, nor when the program is built again
        g.forward(3)
        g.cache("inc")
        g.forward(3)


def test_the_fix_it_names_puts_the_entries_in_that_keeper(tmp_path: Path) -> None:
    disk = DiskKeeper(tmp_path)
    g = Graph.somatize(inner(disk).with_id("enc") >> Inc(), keeper=disk)  # given to both
    with quiet():
        assert g.forward(3) == 9
    assert entries(disk) == 1
    g2 = Graph.somatize(inner(DiskKeeper(tmp_path / "d2")).with_id("enc") >> Inc())
    g2.keeper = g2["enc"].keeper  # the other fix the warning names
    with quiet():
        g2.forward(3)
    assert entries(g2["enc"].keeper) == 1
    g3 = Graph.somatize(inner(DiskKeeper(tmp_path / "d3")).with_id("enc") >> Inc())
    g3["enc"].keeper = None  # or: the outer graph's keeper is meant
    with quiet():
        g3.forward(3)


def test_no_warning_where_no_chosen_keeper_is_passed_over() -> None:
    with quiet():
        # no keeper of its own
        Graph.somatize(inner().with_id("enc") >> Inc()).forward(1)
        # one made on first need (the subgraph run on its own first) was not chosen
        sub = inner()
        sub.forward(1)
        assert isinstance(sub.keeper, MemoryKeeper)
        Graph.somatize(sub.with_id("enc") >> Inc()).forward(1)
        # a keeper, but nothing of the subgraph's remembered (the subgraph node itself
        # cached goes to the outer keeper, as any node's)
        bare = Graph.somatize(Inc() >> Double(), keeper=MemoryKeeper())
        Graph.somatize(bare.with_id("enc") >> Inc()).cache("enc").forward(1)


def test_a_subgraph_at_any_depth_is_named_by_its_path_and_a_named_node_counts() -> None:
    deep = Graph.somatize(Inc() >> Double(), keeper=MemoryKeeper()).name("double", "d-v1")
    mid = Graph.somatize(Inc() >> deep.with_id("blk"))
    g = Graph.somatize(mid.with_id("enc") >> Inc(), keeper=MemoryKeeper())
    with pytest.warns(UserWarning) as caught:
        g.forward(1)
    (w,) = caught
    assert re.search(
        r"subgraph 'enc/blk' has its own keeper.*'enc/blk/double' keeps its entries in "
        r"the outer graph's keeper \(MemoryKeeper\(.*g\['enc'\]\['blk'\]\.keeper",
        str(w.message),
    )


def test_settings_made_after_nesting_are_seen_and_explain_warns_too() -> None:
    sub = Graph.somatize(Inc() >> Double(), keeper=MemoryKeeper())
    g = Graph.somatize(sub.with_id("enc") >> Inc())
    with quiet():
        g.forward(1)  # (nothing remembered yet)
    sub.cache("double")
    with pytest.warns(UserWarning, match="subgraph 'enc' has its own keeper"):
        g.explain(1)


def test_a_subgraph_placed_on_another_host_uses_its_workers_keeper_not_warned_of() -> None:
    g = Graph.somatize(Inc() >> inner(MemoryKeeper()).with_id("enc"))
    g.place("enc", host="box")
    with quiet():
        assert g.forward(1, transports={"box": InProcess()}) == 6
