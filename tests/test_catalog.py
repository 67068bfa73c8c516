"""Catalog (who executes) and Placement (where): the two maps beside the topology."""

from __future__ import annotations

import pytest

from somatize import Catalog, MissingNodeError, Placement


def test_catalog_is_a_read_only_mapping() -> None:
    c = Catalog({"a": 1})
    assert c["a"] == 1 and list(c) == ["a"] and len(c) == 1
    with pytest.raises(MissingNodeError, match="no implementation for node 'b'; known nodes: a"):
        c["b"]
    d = c.with_node("b", 2)
    assert dict(d) == {"a": 1, "b": 2} and dict(c) == {"a": 1}
    assert dict(d.subset(["b"])) == {"b": 2}
    assert repr(d) == "Catalog(a=int, b=int)"


def test_placement_maps_are_independent() -> None:
    p = Placement().place("enc", host="gpu-box").place("enc", device="cuda")
    assert (p.host("enc"), p.device("enc")) == ("gpu-box", "cuda")
    assert (p.host("x"), p.device("x")) == ("local", None)
    assert p.multi_host and not Placement().place("a", device="cuda").multi_host
    assert Placement().hosts == {}  # place() returned new placements
