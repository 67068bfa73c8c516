"""A numpy array a node's key holds (a global its code reads, an attribute it holds) is
hashed at every key, since numpy keeps no record of writes — unless it is read-only, down
to the memory it views: then once (``NdarrayCodec.fingerprint``)."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node
from somatize.torch import NdarrayCodec

TABLE = np.arange(8, dtype=np.float64)


class Look(Node):
    def forward(self, x, ctx):
        return Done(float(TABLE[x]))


def test_a_read_only_array_is_hashed_once_and_a_writeable_one_at_every_call():
    codec = NdarrayCodec()
    fixed = np.arange(1000.0)
    fixed.setflags(write=False)
    first = codec.fingerprint(fixed)
    assert [codec.fingerprint(fixed) for _ in range(3)] == [first] * 3
    assert codec.hashed == 1
    loose = np.arange(1000.0)
    for _ in range(3):
        assert codec.fingerprint(loose) == first  # (the same bytes, dtype and shape)
    assert codec.hashed == 4


def test_a_read_only_array_made_writeable_and_changed_is_hashed_anew():
    codec = NdarrayCodec()
    a = np.arange(10.0)
    a.setflags(write=False)
    before = codec.fingerprint(a)
    a.setflags(write=True)
    a[0] = 99.0
    assert codec.fingerprint(a) != before


def test_a_read_only_view_of_a_writeable_array_follows_writes_to_it():
    codec = NdarrayCodec()
    base = np.arange(10.0)
    view = base[2:]
    view.setflags(write=False)
    before = codec.fingerprint(view)
    base[5] = -1.0  # written through the array it views
    assert codec.fingerprint(view) != before


def test_a_global_array_changed_in_place_is_seen_and_a_read_only_one_is_hashed_once():
    me = sys.modules[__name__]
    g = Graph(keeper=MemoryKeeper()).node("l", Look()).cache("l")
    st.module(g)  # (the torch codecs: tensors and arrays)
    assert g.forward(3) == 3.0
    TABLE[3] = 30.0
    codec = next(c for c in g.codecs if isinstance(c, NdarrayCodec))
    try:
        assert g.forward(3) == 30.0
        hashed = codec.hashed
        for x in range(5):
            g.forward(x)
        assert codec.hashed >= hashed + 5  # writeable: hashed at every key
        fixed = TABLE.copy()
        fixed.setflags(write=False)
        me.TABLE = fixed
        g.forward(3)
        hashed = codec.hashed
        for x in range(5):
            g.forward(x)
        assert codec.hashed == hashed  # five keys, no hash of the table
    finally:
        me.TABLE = np.arange(8, dtype=np.float64)


def test_a_large_writeable_array_in_a_key_warns_once_naming_the_fix():
    codec = NdarrayCodec()
    big = np.zeros(2**20 + 1)  # (8 MiB and a bit)
    with pytest.warns(RuntimeWarning, match=r"shape \(1048577,\).*setflags\(write=False\)"):
        codec.fingerprint(big)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codec.fingerprint(big)  # once
        small = np.zeros(1000)
        codec.fingerprint(small)  # a small one: none


def test_a_file_mapped_read_only_is_hashed_once(tmp_path):
    # np.load(mmap_mode="r"), the usual form of a large embedding table, warned that it
    # was "writeable" and was hashed at every key
    np.save(tmp_path / "table.npy", np.arange(2**20 + 1, dtype=np.float64))
    table = np.load(tmp_path / "table.npy", mmap_mode="r")
    codec = NdarrayCodec()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = codec.fingerprint(table)
        assert codec.fingerprint(table) == first
    assert codec.hashed == 1
    writable = np.load(tmp_path / "table.npy", mmap_mode="r+")
    with pytest.warns(RuntimeWarning, match="writeable numpy array"):
        assert codec.fingerprint(writable) == first
    del table, writable
