"""The row codec's keys: one keyed blake3 per row of a batch, whatever the batch's layout."""

from __future__ import annotations

import pytest
import torch
from blake3 import blake3

from somatize.torch.rows import TensorRows

SALT = bytes(range(32))


def reference(t: torch.Tensor, salt: bytes = SALT) -> list[str]:
    """Each row hashed on its own: a fresh keyed hasher over the row's bytes."""
    return [
        blake3(t[i].contiguous().numpy().tobytes(), key=salt).hexdigest() for i in range(len(t))
    ]


@pytest.mark.parametrize(
    "batch",
    [
        torch.randn(7, 5, generator=torch.Generator().manual_seed(0)),
        torch.randn(5, 7, generator=torch.Generator().manual_seed(1)).t(),  # not contiguous
        torch.arange(24, dtype=torch.int16).reshape(4, 2, 3),
        torch.randn(1, 300, generator=torch.Generator().manual_seed(2)).double(),  # > 1 KiB
    ],
    ids=["float32", "transposed", "int16 3-d", "one long row"],
)
def test_each_row_key_is_keyed_blake3_of_that_row_alone(batch):
    # one hasher serves every row (reset between rows): no row's key may depend on another
    assert TensorRows().keys(batch, SALT) == reference(batch)


def test_equal_rows_share_a_key_and_the_salt_separates_them():
    row = torch.randn(1, 6, generator=torch.Generator().manual_seed(3))
    batch = torch.cat([row, torch.zeros(1, 6), row])
    keys = TensorRows().keys(batch, SALT)
    assert keys[0] == keys[2] != keys[1]
    other = TensorRows().keys(batch, bytes(32))
    assert other == reference(batch, bytes(32)) and set(other).isdisjoint(keys)


def test_rows_without_bytes_share_the_keyed_hash_of_nothing():
    assert TensorRows().keys(torch.zeros(3, 0), SALT) == [blake3(b"", key=SALT).hexdigest()] * 3


def test_row_digests_are_unkeyed_blake3_of_each_row():
    batch = torch.randn(5, 3, generator=torch.Generator().manual_seed(4))
    want = [blake3(batch[i].numpy().tobytes()).digest() for i in range(5)]
    assert TensorRows().digests(batch) == want


def test_a_batch_of_several_tensors_keys_a_row_by_the_digests_of_its_parts():
    from somatize.rows import _keys

    rows = TensorRows()
    a = torch.randn(4, 3, generator=torch.Generator().manual_seed(5))
    b = torch.arange(8, dtype=torch.int64).reshape(4, 2)
    got = _keys([("torch", rows, a), ("torch", rows, b)], SALT)
    parts = zip(rows.digests(a), rows.digests(b))
    assert got == [blake3(da + db, key=SALT).hexdigest() for da, db in parts]
    assert len(set(got)) == 4
