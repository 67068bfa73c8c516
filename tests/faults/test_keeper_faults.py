"""A DiskKeeper under fire: writers killed mid-put, flipped bits and cut entries.

Only ``DiskKeeper.get/put/verify`` are used: whatever else changes in the keeper,
these must hold — an acknowledged put is never lost, a damaged entry is a miss (and
``verify`` reports it), and no read ever returns bytes other than those put.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import time

import pytest
from blake3 import blake3

from somatize.keepers import DiskKeeper

from .conftest import TRIALS


def entry(i: int, salt: str) -> tuple[str, bytes]:
    """Key and value number ``i``: the value says which key it belongs to."""
    key = blake3(f"{salt}:{i}".encode()).hexdigest()
    size = (i * 7919) % 150_000 + 1
    return key, (key.encode() * (size // 64 + 1))[:size]


def _put_forever(path: str, salt: str, ack: int) -> None:
    keeper = DiskKeeper(path)
    i = 0
    while True:
        key, value = entry(i, salt)
        keeper.put(key, value)
        os.write(ack, f"{i}\n".encode())
        i += 1


def _acks(fd: int, timeout: float) -> list[int]:
    out = b""
    ready, _, _ = select.select([fd], [], [], timeout)
    while ready:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
        ready, _, _ = select.select([fd], [], [], 0)
    return [int(x) for x in out.split()]


@pytest.mark.slow
def test_writers_killed_at_random_instants_lose_no_acknowledged_entry(tmp_path, rng):
    path = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    written: dict[str, bytes] = {}  # acknowledged
    possible: dict[str, bytes] = {}  # acknowledged, or being put when the writer died
    for trial in range(TRIALS):
        salt = f"trial{trial}"
        r, w = os.pipe()
        child = ctx.Process(target=_put_forever, args=(str(path), salt, w))
        child.start()
        os.close(w)
        try:
            got = _acks(r, 60)
            assert got, "the writer acknowledged nothing"
            time.sleep(rng.uniform(0, 0.05))  # the fault: land anywhere in a later put
            os.kill(child.pid, signal.SIGKILL)
            child.join(30)
            got += _acks(r, 0)
        finally:
            os.close(r)
            if child.is_alive():
                child.kill()
                child.join()
        for i in range(max(got) + 2):  # the acknowledged ones, and the one being written
            key, value = entry(i, salt)
            possible[key] = value
            if i <= max(got):
                written[key] = value
        keeper = DiskKeeper(path)
        assert keeper.verify() == []  # no torn entry is ever visible
        for key, value in written.items():
            assert keeper.get(key) == value
        for key in keeper.keys():  # noqa: SIM118 -- a keeper, not a dict
            assert keeper.get(key) == possible[key]  # whole, and the bytes put under it


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_entries_are_misses_and_verify_reports_them(tmp_path, rng, damage):
    keeper = DiskKeeper(tmp_path / "cache")
    entries = [entry(i, "d") for i in range(4 * TRIALS)]
    for key, value in entries:
        keeper.put(key, value)
    for n, (key, value) in enumerate(entries):
        file = keeper.path / "objects" / key[:2] / key
        data = bytearray(file.read_bytes())
        if damage == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            del data[rng.randrange(len(data)) :]
        file.write_bytes(bytes(data))
        if n % 2:
            assert keeper.verify() == [key]  # reported, and removed
        else:
            assert keeper.get(key) is None  # a miss, never other bytes
        assert keeper.get(key) is None and not file.exists()
        keeper.put(key, value)  # recomputed and written afresh
        assert keeper.get(key) == value
