"""DiskKeeper against what it does not expect: FIFOs and folders for entries, a full disk."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from somatize import DiskKeeper
from somatize.errors import KeeperError


def k(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened plainly) fails the test instead of hanging it."""

    def hung(signum: int, frame: Any) -> None:
        raise AssertionError("a keeper call blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def entry(keeper: DiskKeeper, key: str) -> Path:
    return keeper.path / "objects" / key[:2] / key


def quarantined(keeper: DiskKeeper) -> list[str]:
    folder = keeper.path / "quarantine"
    return sorted(p.name.split(".")[0] for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("thing", ["fifo", "folder"])
@pytest.mark.parametrize("call", ["get", "get_many", "verify", "gc"])
def test_a_fifo_or_folder_for_an_entry_is_a_miss_and_moved_aside(
    tmp_path: Path, thing: str, call: str
) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"healthy")
    keeper.put(k(2), b"to be replaced")
    path = entry(keeper, k(2))
    path.unlink()
    if thing == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
        (path / "inside").write_text("not ours to delete")
    if call == "get":
        assert keeper.get(k(2)) is None
    elif call == "get_many":
        assert keeper.get_many([k(1), k(2)]) == [b"healthy", None]
    elif call == "verify":
        assert keeper.verify() == [k(2)]
    else:  # no entry in a listing; gc moves it aside and goes on (it failed on a folder)
        assert keeper.stats().entries == 1 and list(keeper.keys()) == [k(1)]
        assert [key for key, _ in keeper.sizes()] == [k(1)]
        keeper.gc(0)
        assert keeper.stats().entries == 0
    assert not os.path.lexists(path) and quarantined(keeper) == [k(2)]
    if thing == "folder":  # moved whole, never deleted
        (moved,) = (keeper.path / "quarantine").iterdir()
        assert (moved / "inside").read_text() == "not ours to delete"
    keeper.put(k(2), b"recomputed")
    assert keeper.get(k(2)) == b"recomputed" and keeper.verify() == []


def test_a_fifo_for_a_pack_or_a_name_never_blocks(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many([(k(1), b"one")])
    os.mkfifo(keeper.path / "packs" / ("f" * 40 + ".pack"))
    os.mkfifo(keeper.path / "names" / "trap")
    other = DiskKeeper(tmp_path / "store")
    assert other.get_many([k(1), k(2)]) == [b"one", None]
    assert other.lookup("trap") is None and other.names() == {}
    assert other.stats().entries == 1
    assert other.verify() == ["packs/" + "f" * 40 + ".pack"]
    assert not (keeper.path / "packs" / ("f" * 40 + ".pack")).exists()


# -- errors: a full or read-only disk -------------------------------------------------------


def no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*.tmp")]


@pytest.mark.parametrize("fails", ["open", "write", "replace"])
def test_a_full_disk_is_a_keeper_error_naming_the_entry_and_nothing_is_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"old")
    keeper.put_many([(k(2), b"packed")])
    keeper.name("best", k(1))
    monkeypatch.setattr(f"somatize.keepers.atomic.os.{fails}", no_space)
    calls = {
        "put": (lambda: keeper.put(k(1), b"new"), f"objects/{k(1)[:2]}/{k(1)}"),
        "put_many": (lambda: keeper.put_many([(k(3), b"x")]), "/packs/"),
        "name": (lambda: keeper.name("best", k(2)), "/names/best"),
        "pin": (lambda: keeper.pin(k(1)), f"/pins/{k(1)}"),
    }
    if fails == "write":
        del calls["pin"]  # an empty marker: no byte to write
    for what, (call, where) in calls.items():
        with pytest.raises(KeeperError) as err:
            call()
        message = str(err.value)
        assert where in message and "No space left on device" in message, what
        assert "; free space on that disk" in message and "$SOMATIZE_CACHE" in message, what
        assert ".tmp" not in message, what  # the intended path, not the temp file's
        assert isinstance(err.value.__cause__, OSError)
        assert err.value.__cause__.errno == errno.ENOSPC
    monkeypatch.undo()
    assert not temp_files(keeper.path)
    assert keeper.get(k(1)) == b"old" and keeper.get(k(2)) == b"packed"
    assert keeper.lookup("best") == b"old" and keeper.stats().pinned == 0
    assert keeper.verify() == []


def test_gc_on_a_read_only_disk_is_a_keeper_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"x" * 10)

    def read_only(path: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr("somatize.keepers.upkeep.os.unlink", read_only)
    with pytest.raises(KeeperError, match=f"could not remove cache file .*{k(1)}: Read-only") as e:
        keeper.gc(0)
    assert "give this user write access to it (a read-only disk: remount it" in str(e.value)
    monkeypatch.undo()
    assert keeper.get(k(1)) == b"x" * 10


def test_a_layout_that_cannot_be_created_is_a_keeper_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(KeeperError, match=r"could not create the cache directory .*file/objects"):
        DiskKeeper(tmp_path / "file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions: chmod cannot test this")
def test_a_read_only_directory(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put(k(1), b"old")
    for p in [keeper.path, *keeper.path.rglob("*")]:
        if p.is_dir():
            p.chmod(0o555)
    try:
        with pytest.raises(KeeperError, match="Permission denied"):
            keeper.put(k(2), b"new")
        with pytest.raises(KeeperError, match="Permission denied"):
            keeper.put_many([(k(3), b"x")])
        assert keeper.get(k(1)) == b"old"
    finally:
        for p in [keeper.path, *keeper.path.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)


TMPFS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from somatize import DiskKeeper
    from somatize.errors import KeeperError

    keeper = DiskKeeper(sys.argv[1])
    stored = {}
    try:
        for i in range(10_000):
            key = "%064x" % i
            keeper.put(key, bytes([i % 256]) * 3000)
            stored[key] = bytes([i % 256]) * 3000
    except KeeperError as e:
        assert "No space left on device" in str(e) and key in str(e), e
    else:
        raise AssertionError("the disk never filled")
    for call in (lambda: keeper.put_many([("f" * 64, bytes(50_000))]),
                 lambda: keeper.put("e" * 64, bytes(50_000))):
        try:
            call()
        except KeeperError as e:
            assert "No space left on device" in str(e), e
        else:
            raise AssertionError("a write on a full disk succeeded")
    assert not list(Path(sys.argv[1]).rglob(".*.tmp")), "temp files left"
    assert all(keeper.get(key) == value for key, value in stored.items())
    assert keeper.verify() == []
    print("ok", len(stored))
    """
)


@pytest.mark.slow
def test_a_really_full_disk(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1): cannot mount a small tmpfs in a private namespace")
    script, mount = tmp_path / "fill.py", tmp_path / "tiny"
    script.write_text(TMPFS)
    mount.mkdir()
    shell = f"mount -t tmpfs -o size=256k tmpfs {mount} && exec {sys.executable} {script} {mount}"
    probe = subprocess.run(
        [
            unshare,
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs tmpfs {mount}",
        ],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({probe.stderr.decode().strip()})")
    done = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


def test_a_corrupt_packed_entry_on_a_read_only_disk_is_still_just_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper = DiskKeeper(tmp_path / "store")
    keeper.put_many([(k(1), b"one"), (k(2), b"two")])
    (pack,) = (keeper.path / "packs").glob("*.pack")
    raw = bytearray(pack.read_bytes())
    raw[-1] ^= 0x01  # k(2)'s payload
    pack.write_bytes(bytes(raw))

    def read_only(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr("somatize.keepers.atomic.os.replace", read_only)
    reader = DiskKeeper(tmp_path / "store")
    assert reader.get_many([k(1), k(2)]) == [b"one", None]  # the clean-up could not write
    assert pack.exists()
