"""The torch-free half of remembered runs: records, the lock, and ``gc`` tending the store."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from somatize import DiskKeeper, runs
from somatize.errors import KeeperError
from tests.test_keepers_locks import held, refusing

OLD = time.time() - 90 * 86400


def _run(store: Path, key: str, record: dict[str, object] | None = None) -> Path:
    d = store / runs.FOLDER / key
    d.mkdir(parents=True)
    body = {"format": runs.FORMAT, "key": key, "status": "done", "function": "m.f"}
    (d / "run.json").write_text(json.dumps({**body, **(record or {})}))
    os.utime(d / "run.json", (OLD, OLD))
    return d


def test_gc_takes_a_runs_key_from_its_directory_never_from_its_record(tmp_path: Path) -> None:
    store = tmp_path / "cache"
    DiskKeeper(store)
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    other = _run(store, "b" * 64)  # a second run, the record below names it
    forged = _run(store, "a" * 64, {"key": "../../precious"})
    copied = _run(store, "c" * 64, {"key": "b" * 64})  # a run directory copied by hand
    os.utime(other / "run.json")  # used now: gc by age keeps it
    (store / runs.FOLDER / ".trash-..").mkdir()
    removed = runs.gc(store, older_than=30 * 86400)
    assert (victim / "thesis.tex").read_text() == "years of work"
    assert other.is_dir()
    assert not forged.exists() and not copied.exists()
    assert sorted(r["key"] for r in removed) == ["a" * 64, "c" * 64]


def test_remove_refuses_what_is_not_a_key_and_says_whether_it_removed(tmp_path: Path) -> None:
    store = runs.RunStore(tmp_path / runs.FOLDER)
    (tmp_path / "sibling").mkdir()
    with pytest.raises(ValueError, match=r"'\.\./sibling' is not a run key"):
        store.remove("../sibling")
    assert (tmp_path / "sibling").is_dir()
    assert store.remove("d" * 64) is False  # nothing there: not reported as removed
    _run(tmp_path, "d" * 64)
    assert store.remove("d" * 64) is True
    assert not store.dir("d" * 64).exists()


def test_gc_keeps_a_run_whose_lock_is_held_and_a_run_started_later_locks_afresh(
    tmp_path: Path,
) -> None:
    store = runs.RunStore(tmp_path / runs.FOLDER)
    key = "e" * 64
    _run(tmp_path, key)
    with store.lock(key) as locked:
        assert locked
        assert runs.gc(tmp_path, older_than=0) == []  # computing now: kept
    assert store.dir(key).is_dir()
    assert [r["key"] for r in runs.gc(tmp_path, older_than=0)] == [key]
    with store.lock(key) as locked:  # a new run of that key gets a lock in a new directory
        assert locked and (store.dir(key) / "lock").is_file()


@pytest.mark.parametrize(
    ("older_than", "max_bytes"), [(-1.0, None), (None, -5), (float("nan"), None)]
)
def test_gc_refuses_a_negative_age_or_size(
    tmp_path: Path, older_than: float | None, max_bytes: int | None
) -> None:
    d = _run(tmp_path, "f" * 64)
    with pytest.raises(ValueError, match="0 or more"):
        runs.gc(tmp_path, older_than=older_than, max_bytes=max_bytes)
    assert d.is_dir()


def test_gc_given_no_directory_says_which_to_give() -> None:
    with pytest.raises(ValueError, match=r"nowhere to look: give keeper_dir .*runs_dir="):
        runs.gc(None)


@pytest.mark.parametrize("text", ["-3d", "-1", "nan", "inf"])
def test_parse_age_refuses_what_is_not_an_age(text: str) -> None:
    with pytest.raises(ValueError, match="not an age"):
        runs.parse_age(text)


def test_gc_removes_old_trash_folders_and_temp_files_but_not_fresh_ones(tmp_path: Path) -> None:
    d = _run(tmp_path, "0" * 64)
    os.utime(d / "run.json")  # in use: the run stays
    root = tmp_path / runs.FOLDER
    old_trash, new_trash = root / f".trash-{'1' * 64}-7", root / f".trash-{'2' * 64}-8"
    for trash in (old_trash, new_trash):
        (trash / "ckpt").mkdir(parents=True)
        (trash / "ckpt" / "step.ckpt").write_bytes(b"x" * 10)
    old_temp, new_temp = d / ".run.json.7-0.tmp", d / ".run.json.8-0.tmp"
    old_temp.write_bytes(b"{")
    new_temp.write_bytes(b"{")
    for p in (old_trash, old_temp):
        os.utime(p, (OLD, OLD))
    runs.gc(tmp_path, older_than=30 * 86400)
    assert not old_trash.exists() and not old_temp.exists()
    assert new_trash.is_dir() and new_temp.is_file()  # perhaps a live process's
    assert d.is_dir()


def test_an_unreadable_record_is_an_error_naming_it_not_an_unfinished_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "3" * 64
    _run(tmp_path, key)
    real = os.open

    def denied(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(path) == "run.json":  # another user's store, mode 0600 (chmod: root)
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(KeeperError, match=r"cannot read the run record .*run\.json"):
        runs.RunStore(tmp_path / runs.FOLDER).record(key)
    (listed,) = runs.RunStore(tmp_path / runs.FOLDER).records()
    assert listed["status"] == "unreadable" and listed["key"] == key


def test_a_run_whose_directory_gc_moves_while_it_locks_still_gets_a_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = runs.RunStore(tmp_path / runs.FOLDER)
    real, moved = os.open, []

    def racing(path: object, *args: object, **kwargs: object) -> int:
        if str(path).endswith("lock") and not moved:  # gc renames the directory just now
            moved.append(path)
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real(path, *args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(os, "open", racing)
    with store.lock("9" * 64) as locked:
        assert moved and locked  # tried again in the new directory, not run unlocked


def test_a_run_lock_this_user_may_only_read_is_still_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fcntl")
    store, key, idle = runs.RunStore(tmp_path / runs.FOLDER), "4" * 64, "5" * 64
    for k in (key, idle):
        _run(tmp_path, k)
        with store.lock(k):  # the lock files made, by "another user"
            pass
    refusing(monkeypatch, errno.EACCES, reading=True, lock="/lock")
    with store.lock(key) as locked:
        assert locked and held(store.dir(key) / "lock")  # (before: ran unlocked, silently)
        removed = runs.gc(tmp_path, older_than=0)  # gc too takes the locks read-only
    assert [r["key"] for r in removed] == [idle]
    assert store.dir(key).is_dir()  # (before: removed while it computed)


def test_a_run_lock_that_cannot_be_opened_is_a_warning_naming_it_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fcntl")
    store, key = runs.RunStore(tmp_path / runs.FOLDER), "6" * 64
    refusing(monkeypatch, errno.EACCES, reading=False, lock="/lock")
    lock = re.escape(str(store.dir(key) / "lock"))
    said = rf"could not open the lock file {lock} .*remembered run 666666666666.*write access"
    with pytest.warns(UserWarning, match=said), store.lock(key) as locked:
        assert not locked
    _run(tmp_path, key)
    with pytest.warns(UserWarning, match=rf"{lock} .*runs gc's removal of run 666666666666"):
        assert [r["key"] for r in runs.gc(tmp_path, older_than=0)] == [key]


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_on_a_read_only_or_full_disk_no_run_lock_goes_unsaid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    pytest.importorskip("fcntl")
    refusing(
        monkeypatch, code, reading=False, lock="/lock"
    )  # (no record can be written there either)
    with runs.RunStore(tmp_path / runs.FOLDER).lock("7" * 64) as locked:  # (no warning)
        assert not locked


@pytest.mark.skipif(
    not hasattr(os, "fork") or not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="switching users needs root",
)
def test_another_user_of_the_store_takes_the_same_run_lock() -> None:
    """A real second user (uid 65534), who may read but not write the run's lock file."""
    base = tempfile.mkdtemp()
    key = "8" * 64
    try:
        os.chmod(base, 0o755)
        store = runs.RunStore(Path(base) / runs.FOLDER)
        old = os.umask(0o022)
        try:
            with store.lock(key):  # the lock file: 0o644, root's
                pass
        finally:
            os.umask(old)
        assert os.stat(store.dir(key) / "lock").st_mode & 0o777 == 0o644
        with warnings.catch_warnings():  # (3.12 warns of forking a process with threads)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the other user: locks, and the lock is held while it does
            code = 2
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                with store.lock(key) as locked:
                    code = 0 if locked and held(store.dir(key) / "lock") else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # (before: 1, it ran unlocked)
    finally:
        shutil.rmtree(base)
