"""A DiskKeeper under fire: writers killed mid-put, flipped bits and cut entries.

Only ``DiskKeeper.get/put/verify`` are used, and files are damaged wherever they lie
(whatever the layout): whatever else changes in the keeper,
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
        for key, value in possible.items():  # the one being written: absent, or whole
            assert keeper.get(key) in (None, value)


def _files(root):
    """Every file under the keeper's directory (whatever its layout), temp files aside."""
    return sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if not f.startswith(".")
    )


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_entries_are_misses_and_verify_reports_them(tmp_path, rng, damage):
    keeper = DiskKeeper(tmp_path / "cache")
    entries = dict(entry(i, "d") for i in range(12))
    seen = 0
    for _trial in range(4 * TRIALS):
        for key, value in entries.items():
            if keeper.get(key) is None:
                keeper.put(key, value)
        victim = rng.choice([f for f in _files(keeper.path) if os.path.getsize(f)])
        with open(victim, "rb") as f:
            data = bytearray(f.read())
        if damage == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            del data[rng.randrange(len(data)) :]
        with open(victim, "wb") as f:
            f.write(bytes(data))
        if _trial % 2:  # verify first: it reports (and removes) what it finds damaged
            reported = keeper.verify()
            assert set(reported) <= set(entries)
            seen += len(reported)
        got = {key: keeper.get(key) for key in entries}
        assert all(got[k] in (None, v) for k, v in entries.items())  # a miss, never other bytes
        seen += sum(v is None for v in got.values())
        assert keeper.verify() == []  # a damaged entry does not outlive a read
    assert seen >= 4 * TRIALS // 2  # the damage was seen, not missed
    for key, value in entries.items():  # recomputed and written afresh, it reads back
        keeper.put(key, value)
        assert keeper.get(key) == value
