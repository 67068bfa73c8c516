"""The lock files of a store several users share: made as its other files are (``0o666``
less the umask), taken read-only by a user who may not write them (``flock`` needs no
write access), and a warning — not silence — where none can be opened."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from somatize import DiskKeeper
from somatize.keepers import upkeep

fcntl = pytest.importorskip("fcntl")


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def held(lock: Path) -> bool:
    """Whether some open file holds an flock on ``lock`` (tried from a file of our own)."""
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def refusing(
    monkeypatch: pytest.MonkeyPatch, code: int, *, reading: bool, lock: str = ".lock"
) -> None:
    """``os.open`` of a lock file (a path ending in ``lock``) fails with ``code`` for
    writing (and reading too unless ``reading``), as for a user whom its mode shuts out."""
    real = os.open

    def opener(path, flags, *args):  # type: ignore[no-untyped-def]
        if str(path).endswith(lock) and (flags & (os.O_RDWR | os.O_WRONLY) or not reading):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", opener)


def test_a_group_shared_store_makes_its_pin_lock_group_writable(tmp_path: Path) -> None:
    with umask(0o002):
        keeper = DiskKeeper(tmp_path / "store")
        keeper.put("ab" * 32, b"x")
        keeper.pin("ab" * 32)
    mode = os.stat(tmp_path / "store" / "pins" / ".lock").st_mode & 0o777
    assert mode == 0o664  # (before: 0o644, which another user of the group cannot open O_RDWR)


def test_a_lock_this_user_may_only_read_is_still_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    DiskKeeper(tmp_path).pin("ab" * 32)  # pins/.lock made, by "another user"
    refusing(monkeypatch, errno.EACCES, reading=True)
    with upkeep.pins_locked(str(tmp_path), exclusive=True):
        assert held(tmp_path / "pins" / ".lock")  # (before: gc went on unlocked, silently)


def test_no_lock_at_all_is_said_in_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    refusing(monkeypatch, errno.EACCES, reading=False)
    said = r"could not open the lock file .*pins.* unguarded"
    with pytest.warns(UserWarning, match=said), upkeep.pins_locked(str(tmp_path), exclusive=True):
        pass


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_on_a_read_only_or_full_disk_no_lock_goes_unsaid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    refusing(monkeypatch, code, reading=False)  # (no other process can pin there either)
    with upkeep.pins_locked(str(tmp_path), exclusive=True):  # (a warning would fail the test)
        pass


@pytest.mark.skipif(
    not hasattr(os, "fork") or os.geteuid() != 0, reason="switching users needs root"
)
def test_another_user_of_the_store_takes_the_same_lock() -> None:
    """A real second user (uid 65534), who may read but not write pins/.lock."""
    base = tempfile.mkdtemp()
    try:
        os.chmod(base, 0o755)
        with umask(0o022):
            DiskKeeper(base).pin("ab" * 32)  # pins/.lock: 0o644, root's
        with warnings.catch_warnings():  # (3.12 warns of forking a process with threads)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the other user: locks, and the lock is held while it does
            code = 2
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                with upkeep.pins_locked(base, exclusive=False):
                    code = 0 if held(Path(base) / "pins" / ".lock") else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # (before: 1, it pinned unlocked)
    finally:
        shutil.rmtree(base)


def test_a_forked_child_does_not_keep_a_lock_after_its_parent_lets_go(tmp_path: Path) -> None:
    # A DataLoader worker forked while a fit holds its checkpoint directory's lock shared
    # the lock's open file, and held the lock on after the fit (the next fit was refused).
    from somatize.keepers.locks import close_lock, open_lock

    lock = tmp_path / "lock"
    fd = open_lock(str(lock), "this test")
    assert fd is not None
    fcntl.flock(fd, fcntl.LOCK_EX)
    reader, writer = os.pipe()
    ready, started = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (fork's hooks have run): waits, holding what it kept, till told
        os.close(writer)
        os.write(started, b"!")
        os.read(reader, 1)
        os._exit(0)
    os.close(reader)
    os.close(started)
    try:
        assert os.read(ready, 1) == b"!"
        assert held(lock)  # the parent's lock stands in the child's lifetime
        close_lock(fd)
        assert not held(lock)  # the child kept no copy of it
    finally:
        os.close(writer)
        os.close(ready)
        os.waitpid(pid, 0)
