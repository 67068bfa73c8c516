"""DiskKeeper under several processes: concurrent writers, batch writers and gc never serve
wrong bytes, and a writer killed mid-write leaves no partial entry."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from somatize import DiskKeeper
from tests.keeper_keys import k

# -- several processes --------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import random, sys
    from somatize import DiskKeeper

    path, seed, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    keeper = DiskKeeper(path)
    rnd = random.Random(seed)

    def content(i):
        return (b"entry %d;" % i) * (200 + 50 * i)

    keys = ["%064x" % i for i in range(30)]
    wrong = 0
    if role == "tend":  # gc (keeping everything) and stats while the others write
        for _ in range(150):
            keeper.gc(1 << 40)
            keeper.stats()
            keeper.verify()
    elif role == "shrink":  # gc that removes and rewrites packs while others read them
        for n in range(60):
            keeper.pin("%064x" % (20 + n % 60))  # pinned one by one: gc rewrites its pack
            keeper.gc(20_000)
    elif role == "batch":  # packs of per-example entries, 20..79 (20..29 also loose)
        many = ["%064x" % i for i in range(20, 80)]
        for _ in range(20):
            rows = rnd.sample(range(20, 80), 6)
            keeper.put_many([("%064x" % i, content(i)) for i in rows])
            asked = rnd.sample(range(80), 10)
            for i, got in zip(asked, keeper.get_many(["%064x" % i for i in asked])):
                if got is not None and got != content(i):
                    wrong += 1
        keeper.put_many([(key, content(int(key, 16))) for key in many])  # all of them, at last
    else:
        order = list(range(30))
        for _ in range(3):
            rnd.shuffle(order)
            for i in order:
                keeper.put(keys[i], content(i))
                keeper.name("n%d" % (i % 4), keys[i])
                j = rnd.randrange(30)
                got = keeper.get(keys[j])
                if got is not None and got != content(j):
                    wrong += 1
    print(wrong)
    """
)


def content(i: int) -> bytes:
    return (b"entry %d;" % i) * (200 + 50 * i)


def run_roles(tmp_path: Path, env: dict[str, str], roles: list[str]) -> Path:
    """Run the WRITER script once per role, at once; each must see no wrong bytes."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    store = tmp_path / "store"
    DiskKeeper(store)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(store), str(seed), role],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed, role in enumerate(roles)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            outputs.append((p.returncode, out.strip(), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out, err in outputs:
        assert rc == 0, err
        assert out == "0"  # no reader ever saw wrong bytes
    return store


@pytest.mark.slow
def test_concurrent_writers_leave_a_consistent_store(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    store = run_roles(tmp_path, subprocess_env, ["write", "write", "batch", "batch", "tend"])
    keeper = DiskKeeper(store)
    assert keeper.verify() == []
    assert sorted(keeper.keys()) == [k(i) for i in range(80)]
    for i in range(80):
        assert keeper.get(k(i)) == content(i)
    assert keeper.get_many([k(i) for i in range(80)]) == [content(i) for i in range(80)]
    for name, key in keeper.names().items():
        assert keeper.lookup(name) == content(int(key, 16))
    assert not [f for f in store.rglob(".*.tmp")]  # every writer finished its renames


@pytest.mark.slow
def test_gc_removing_and_rewriting_packs_under_readers_never_serves_wrong_bytes(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    store = run_roles(tmp_path, subprocess_env, ["batch", "batch", "shrink", "shrink"])
    keeper = DiskKeeper(store)
    assert keeper.verify() == []
    got = keeper.get_many([k(i) for i in range(80)])
    assert all(g is None or g == content(i) for i, g in enumerate(got))
    assert keeper.stats().pinned > 0


KILLED = textwrap.dedent(
    """
    import os, sys
    from somatize import DiskKeeper

    path, mode, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    keeper = DiskKeeper(path)

    def content(i):
        return (b"%d:" % i) * (1 << 20)  # megabytes: a write takes a while

    if mode == "pause":  # stop inside the write, after the bytes, before the rename
        real_replace = os.replace

        def replace(src, dst):
            print("paused", flush=True)
            sys.stdin.readline()  # the parent kills us while we wait here
            real_replace(src, dst)

        os.replace = replace
    i = first
    while True:
        print("put", i, flush=True)
        keeper.put("%064x" % (i % 6), content(i % 6))
        i += 1
    """
)


def big_content(i: int) -> bytes:
    return (b"%d:" % i) * (1 << 20)


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_no_partial_entry(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    store = tmp_path / "store"
    keeper = DiskKeeper(store)
    rnd = random.Random(20240607)
    rounds = ["pause", "random", "pause", "random", "random", "random", "pause", "random"]
    for n, mode in enumerate(rounds):
        first = rnd.randrange(6)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(store), mode, str(first)],
            env=subprocess_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            if mode == "pause":
                assert proc.stdout.readline().split() == ["put", str(first)]
                before = set(keeper.keys())
                assert proc.stdout.readline().strip() == "paused"
            else:
                for _ in range(rnd.randint(1, 4)):  # kill somewhere in the next write
                    assert proc.stdout.readline().startswith("put")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdin:
                proc.stdin.close()
            if proc.stdout:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL, f"round {n}: the writer was not killed"
        if mode == "pause":
            # the bytes were written to a temp file that was never renamed: invisible
            assert set(keeper.keys()) == before
            assert list(store.rglob(f".{k(first)}.*.tmp"))
            if k(first) not in before:
                assert keeper.get(k(first)) is None
        for key in list(keeper.keys()):  # whatever is visible is complete and verified
            assert keeper.get(key) == big_content(int(key, 16)), f"round {n}: {key} is torn"
        assert keeper.verify() == []
    for tmp in store.rglob(".*.tmp"):  # leftovers of killed writers: gc takes them once old
        os.utime(tmp, (1_000_000, 1_000_000))
    keeper.gc(1 << 40)
    assert not list(store.rglob(".*.tmp"))
    assert all(keeper.get(key) is not None for key in list(keeper.keys()))
