"""somatize.platforms: the OS calls that differ on macOS and Windows, simulated on Linux."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import somatize
from somatize import DiskKeeper, platforms

# every byte value, and the ones Windows' text mode changes: "\n" written as "\r\n", a
# read stopped at "\x1a"
AWKWARD = bytes(range(256)) + b"\n\r\n\x1a\n"


def test_pread_without_os_pread_reads_as_os_pread_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.write_bytes(AWKWARD)
    fd = os.open(path, os.O_RDONLY)
    try:
        want = [os.pread(fd, 7, 250), os.pread(fd, 100, 200), os.pread(fd, 5, 1000)]
        monkeypatch.delattr(os, "pread")  # as on Windows
        assert [platforms.pread(fd, 7, 250), platforms.pread(fd, 100, 200)] == want[:2]
        assert platforms.pread(fd, 5, 1000) == want[2] == b""
    finally:
        os.close(fd)


def test_a_disk_keeper_works_without_os_pread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "pread")  # Windows has none: every pack read went through it
    keeper = DiskKeeper(tmp_path / "store")
    rows = [(f"{i:064x}", AWKWARD + bytes([i])) for i in range(50)]
    keeper.put_many(rows)  # a pack
    keeper.put(f"{99:064x}", AWKWARD)  # a loose entry
    fresh = DiskKeeper(tmp_path / "store")
    assert fresh.get_many([k for k, _ in rows]) == [v for _, v in rows]
    assert fresh.get(f"{99:064x}") == AWKWARD
    assert list(fresh.verify()) == []  # every checksum holds


def test_alive_on_windows_asks_the_kernel_and_never_calls_os_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Kernel32:  # OpenProcess / GetExitCodeProcess / CloseHandle, as Windows answers
        def __init__(self, codes: dict[int, int]) -> None:
            self.codes, self.closed = codes, 0

        def OpenProcess(self, access: int, inherit: bool, pid: int) -> int:
            return pid if pid in self.codes else 0

        def GetExitCodeProcess(self, handle: int, code: object) -> int:
            code._obj.value = self.codes[handle]  # type: ignore[attr-defined]
            return 1

        def CloseHandle(self, handle: int) -> int:
            self.closed += 1
            return 1

    def kill(pid: int, sig: int) -> None:  # on Windows: TerminateProcess(pid, sig)
        raise AssertionError(f"os.kill({pid}, {sig}) would end process {pid} on Windows")

    kernel = Kernel32({10: 259, 11: 0})  # 259: STILL_ACTIVE
    errors = {20: 5}  # ERROR_ACCESS_DENIED: another user's process, which exists
    last = [0]
    real = kernel.OpenProcess

    def open_process(access: int, inherit: bool, pid: int) -> int:
        last[0] = errors.get(pid, 87)  # ERROR_INVALID_PARAMETER: no such process
        return real(access, inherit, pid)

    kernel.OpenProcess = open_process  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(platforms, "_kernel32", lambda: (kernel, lambda: last[0]))
    assert [platforms.alive(p) for p in (10, 11, 20, 30)] == [True, False, True, False]
    assert kernel.closed == 2


def test_alive_on_posix_is_os_kill_0() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert platforms.alive(os.getpid())
    assert not platforms.alive(child.pid)  # reaped: gone


def test_blocking_leaves_a_descriptor_alone_where_nothing_opens_non_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(fd: int, blocking: bool) -> None:  # Windows: files are no pipes (OSError)
        raise OSError(22, "Invalid argument")

    (tmp_path / "f").write_bytes(b"x")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        monkeypatch.setattr(os, "set_blocking", refuse)
        with pytest.raises(OSError):
            platforms.blocking(fd)  # Linux: O_NONBLOCK was given, so it is undone
        monkeypatch.setattr(platforms, "NONBLOCK", 0)
        platforms.blocking(fd)
    finally:
        os.close(fd)


# os.open calls that need no O_BINARY: nothing is read or written through them
_NO_DATA = {
    ("cli.py", "os.devnull"),
    ("keepers/atomic.py", "directory"),  # fsync_dir
    ("keepers/locks.py", "path"),  # a lock file: flock only
    ("torch/claims.py", "folder"),  # a directory: flock only
}


def test_every_os_open_of_data_is_binary_on_windows() -> None:
    """Without ``O_BINARY`` Windows opens in text mode and tears binary files."""
    root = Path(somatize.__file__).parent
    missing = []
    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root).as_posix()
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for call in ast.walk(tree):
            if not (
                isinstance(call, ast.Call)
                and ast.unparse(call.func) == "os.open"
                and len(call.args) >= 2
            ):
                continue
            flags = ast.unparse(call.args[1])
            if (rel, ast.unparse(call.args[0])) in _NO_DATA:
                continue
            if "BINARY" not in flags and "READ_NONBLOCK" not in flags:
                missing.append(f"{rel}:{call.lineno} os.open(..., {flags})")
    assert not missing, "opened in text mode on Windows: " + "; ".join(missing)


def test_replace_retries_on_windows_while_a_reader_holds_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Windows refuses to replace a file another process has open (PermissionError), where
    # POSIX replaces it under the reader: an atomic write failed for a passing reader
    from somatize.keepers.atomic import atomic_write

    real, refusals = os.replace, []

    def held(src, dst):
        if len(refusals) < 3:
            refusals.append(dst)
            raise PermissionError(13, "The process cannot access the file", str(dst))
        real(src, dst)

    target = tmp_path / "entry"
    target.write_bytes(b"old")
    monkeypatch.setattr(platforms, "_REPLACE_WAITS", (0.0,) * 7)
    monkeypatch.setattr(os, "replace", held)
    monkeypatch.setattr(sys, "platform", "win32")
    atomic_write(target, AWKWARD)
    assert target.read_bytes() == AWKWARD and len(refusals) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]  # no temp file left

    refusals.clear()
    monkeypatch.setattr(sys, "platform", "linux")  # POSIX: no retry, the error as it came
    with pytest.raises(PermissionError):
        atomic_write(target, b"new")
    assert len(refusals) == 1 and target.read_bytes() == AWKWARD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]
