"""Remembered runs, the torch-free half: each run's record, its lock, tending the store.

A call of a training function is keyed like a node (``somatize.runkey``). Each run has
a directory named by its key under ``<keeper dir>/remembered/``::

    remembered/<key>/run.json   what was called, its status, metrics, size (plain JSON)
    remembered/<key>/ckpt/      the run's checkpoints: a killed run resumes from them
    remembered/<key>/lock       held (flock) while the run computes: a second caller waits

The result itself lives in the keeper under the key. ``somatize.torch.remember`` adds
the codecs, the ``TrainResult`` encoding and the checkpoint accessor.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import KeeperError
from .keepers import atomic_write
from .keepers.locks import close_lock, open_lock
from .keepers.protocol import is_key
from .runs_explain import explain  # (runs.explain, as before)
from .runs_files import RECORD_BYTES as RECORD_BYTES  # (runs.RECORD_BYTES, as before)
from .runs_files import own_dir, read_record

__all__ = ["RunStore", "explain", "gc", "parse_age", "unless_busy"]

FORMAT = "somatize.run/1"
FOLDER = "remembered"  # under a DiskKeeper's directory
_STALE = 3600.0  # seconds: a temp file or trash folder this old belongs to no live process
_TRASH = re.compile(r"\A\.trash-[0-9a-f]{64}-\d+\Z")  # what remove() renames a run to
UNJUDGED = ("damaged", "unreadable")  # statuses of runs gc keeps: their records say nothing

# The type of each field a record may hold: a hand-edited or damaged run.json is reported
# by its path, never trusted (``runs ls`` formats these fields, gc sums ``bytes``).
_FIELDS: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(("function", "code", "versions", "status", "error"), str),
    **dict.fromkeys(("helpers", "args", "summary", "result", "metrics"), dict),
    "excluded": list,
    **dict.fromkeys(("started", "finished"), (int, float)),
}


def _damage(record: object) -> str | None:
    """What makes ``record`` (a parsed run.json) no run record, or None."""
    if not isinstance(record, dict):
        return f"it is not a run record (a {type(record).__qualname__}, not a JSON object)"
    if record.get("format") != FORMAT:
        return f"its format is {record.get('format')!r}, not {FORMAT!r}"
    for field, kind in _FIELDS.items():
        value = record.get(field)
        if field in record and (not isinstance(value, kind) or isinstance(value, bool)):
            want = f"a {kind.__name__}" if isinstance(kind, type) else "a number"
            return f"its field {field!r} is {_a(value)}, not {want}"
    size = record.get("bytes", 0)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return f"its field 'bytes' is {_a(size)}, not a count of bytes"
    return None


def _a(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({value!r:.40})"


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_size
    return total


class RunStore:
    """The directories of remembered runs under ``root`` (``<keeper dir>/remembered``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def dir(self, key: str) -> Path:
        return self.root / key

    def checkpoints(self, key: str) -> Path:
        return self.dir(key) / "ckpt"

    def record(self, key: str) -> dict[str, Any] | None:
        """The record of run ``key``, or None (never started, or no run record: not JSON,
        another format, a status that is not a string). A record with another field of the
        wrong type is returned: recalling the run needs its status alone, and a finished
        run is not computed again for a damaged summary (``records`` lists it damaged).

        Raises:
            KeeperError: the record exists but this process may not read it (another
                user's store): naming the file, rather than taking the run as unfinished.
        """
        return self._read(key)[0]

    def _read(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """(run ``key``'s record or None, what is wrong with its run.json or None)."""
        file = self.dir(key) / "run.json"
        if self.dir(key).is_symlink():  # no run of this store: never recalled through it
            return None, None
        try:
            record = json.loads(read_record(str(file)))
        except PermissionError as e:
            raise KeeperError(
                f"cannot read the run record {file}: {e.strerror or e}; give this user read "
                "and write access to the store (its files follow the umask of the process "
                "that wrote them), or use a store of its own"
            ) from e
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as e:  # not JSON, not UTF-8, a directory in its place
            return None, f"it cannot be read as JSON ({e})"
        damage = _damage(record)
        if damage is None:
            return record, None
        usable = isinstance(record, dict) and record.get("format") == FORMAT
        return (record if usable and isinstance(record.get("status"), str) else None), damage

    def write(self, key: str, record: dict[str, Any]) -> None:
        """Write run ``key``'s record atomically.

        Raises:
            KeeperError: naming the path (a read-only or full disk).
        """
        file = self.dir(key) / "run.json"
        try:
            own_dir(str(self.dir(key)))  # (a link planted at a predicted key: replaced)
            atomic_write(file, json.dumps({"format": FORMAT, "key": key, **record}).encode())
        except OSError as e:
            raise KeeperError(f"could not write the run record {file}: {e}") from e

    def touch(self, key: str) -> None:
        """Mark run ``key`` as used now (gc by age removes the longest unused)."""
        with contextlib.suppress(OSError):
            os.utime(self.dir(key) / "run.json")

    @contextlib.contextmanager
    def lock(self, key: str, waiting: Callable[[], None] | None = None) -> Iterator[bool]:
        """Hold run ``key``'s lock (waiting for another process that holds it); yields whether
        a lock could be taken (not on a read-only disk, nor where ``fcntl`` is missing). A
        lock file of another user's that this one may not write is taken read-only; one
        that cannot be opened at all is a warning naming it (``keepers.locks.open_lock``).
        With ``waiting``, the lock is tried every second and ``waiting()`` called between
        tries (a DDP rank 0 telling its peers it still waits)."""
        try:
            import fcntl
        except ImportError:
            yield False
            return
        lock = str(self.dir(key) / "lock")
        while True:
            # (made again if `runs gc` moved it meanwhile; a link there is replaced, and one
            # that cannot be is never locked through: the record's write then says why)
            if not _owned(self.dir(key)):
                yield False
                return
            fd = open_lock(lock, f"calls of the remembered run {key[:12]}")
            if fd is None:  # a read-only disk, or a warning said why
                yield False
                return
            try:
                if waiting is None:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
                else:
                    while True:
                        try:
                            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                            break
                        except BlockingIOError:
                            waiting()
                            time.sleep(1.0)
                if _still_there(fd, self.dir(key) / "lock"):
                    break
            except BaseException:
                close_lock(fd)
                raise
            close_lock(fd)  # `runs gc` removed the run meanwhile: lock the new directory
        try:
            yield True
        finally:
            close_lock(fd)

    def records(self) -> list[dict[str, Any]]:
        """Every run's record, with its ``size`` (checkpoints and result) and ``used`` time; a
        directory without a record (killed before it wrote one) is listed as ``unknown``, a
        record that is not one as ``damaged`` (with ``damage``, why, and ``record``, its
        path), one this process may not read as ``unreadable``."""
        out: list[dict[str, Any]] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            # not a key: a trash folder, a temp file, something not ours; a link: not a run
            # directory of this store (listing, sizing or gc would reach wherever it points)
            if not is_key(d.name) or d.is_symlink():
                continue
            try:
                record, damage = self._read(d.name)
            except KeeperError:
                record, damage = {"status": "unreadable"}, None
            if damage is not None:  # shown with its path; gc keeps it (it cannot judge it)
                record = {"status": "damaged", "damage": damage, "record": str(d / "run.json")}
            record = record or {"status": "unknown"}
            # The key is the directory's name, never what the record says: a copied or
            # forged run.json must not point gc at another run, or outside the store.
            record = {**record, "key": d.name}
            try:
                used = (d / "run.json").stat().st_mtime
            except OSError:
                try:
                    used = d.stat().st_mtime
                except OSError:  # removed meanwhile by another process's gc
                    continue
            size = _size(d) + int(record.get("bytes", 0) if record.get("status") == "done" else 0)
            out.append({**record, "size": size, "used": used})
        return out

    def remove(self, key: str, keeper: Any = None) -> bool:
        """Forget run ``key``: its directory, and its result in ``keeper`` (a DiskKeeper).
        Returns whether the directory was removed (False: gone already, or not removable).

        Raises:
            ValueError: ``key`` is not a key (64 hex digits).
        """
        if not is_key(key):
            raise ValueError(
                f"{key!r} is not a run key (64 lowercase hex digits); nothing was removed"
            )
        d = self.dir(key)
        trash = self.root / f".trash-{key}-{os.getpid()}"
        try:
            os.replace(d, trash)  # the record disappears at once: no half-removed run is recalled
        except OSError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        if keeper is not None:
            self._discard(key, keeper)
        return True

    def _discard(self, key: str, keeper: Any) -> None:
        discard = getattr(keeper, "discard", None)
        with contextlib.suppress(OSError):  # KeeperError is an OSError
            if discard is not None:
                discard(key)
            else:  # a DiskKeeper without discard: its documented layout, objects/ab/<key>
                os.unlink(Path(keeper.path) / "objects" / key[:2] / key)


def parse_age(text: str) -> float:
    """Seconds in ``"90"``, ``"30m"``, ``"12h"``, ``"7d"``.

    Example:
        >>> parse_age("2h")
        7200.0
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"not an age: {text!r}; write e.g. 90, 30m, 12h or 7d") from None
    if not seconds >= 0 or seconds == float("inf"):  # -3d would forget every run; so would nan
        raise ValueError(f"not an age: {text!r}; an age is 0 or more, e.g. 90, 30m, 12h or 7d")
    return seconds


def gc(
    keeper_dir: str | os.PathLike[str] | None,
    *,
    older_than: float | None = None,
    max_bytes: int | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
) -> list[dict[str, Any]]:
    """Forget remembered runs unused for ``older_than`` seconds, then the least recently used
    until at most ``max_bytes`` remain. Runs computing now (their lock held) are kept.
    Temp files and trash folders left by killed processes (over an hour old) go too. A
    run whose record is damaged or unreadable (``UNJUDGED``) is never removed.
    Returns the records of the runs removed.

    Args:
        keeper_dir: the ``DiskKeeper`` directory holding the runs' results (removed with
            them); None: results stay where they are (a ``somatize cache gc`` reclaims them).
        runs_dir: the runs' directory, for ``st.remember(..., dir=...)``; default
            ``<keeper_dir>/remembered``.

    Raises:
        ValueError: ``older_than`` or ``max_bytes`` is below 0, or neither directory given.
    """
    from .keepers import DiskKeeper

    if keeper_dir is None and runs_dir is None:
        raise ValueError(
            "gc(None, runs_dir=None) has nowhere to look: give keeper_dir (a DiskKeeper's "
            "directory), runs_dir= (st.remember's dir=), or both"
        )
    if older_than is not None and not older_than >= 0:
        raise ValueError(f"older_than={older_than!r}: an age in seconds is 0 or more")
    if max_bytes is not None and (isinstance(max_bytes, bool) or max_bytes < 0):
        raise ValueError(f"max_bytes={max_bytes!r}: a size in bytes is 0 or more")
    keeper = DiskKeeper(keeper_dir) if keeper_dir is not None else None
    store = RunStore(runs_dir if runs_dir is not None else Path(keeper_dir or "") / FOLDER)
    _clean_leftovers(store.root)
    runs = sorted(store.records(), key=lambda r: float(r["used"]))
    now, removed = time.time(), []
    total = sum(int(r["size"]) for r in runs)
    for r in runs:
        if r.get("status") in UNJUDGED:  # its record cannot say what it is: left to a person
            continue
        old = older_than is not None and now - float(r["used"]) > older_than
        big = max_bytes is not None and total > max_bytes
        if not (old or big):
            continue
        with unless_busy(store, str(r["key"])) as free:
            # removed while its lock is held: a run starting now waits, then finds it gone
            if not free or not store.remove(str(r["key"]), keeper):
                continue
        total -= int(r["size"])
        removed.append(r)
    return removed


def _owned(d: Path) -> bool:
    """Remove a link at run directory ``d`` or its ``ckpt/`` (``own_dir``; ``open_lock``
    makes the directory); False where a link stays (not removable by this user), True on
    other errors (the lock's and the write's own say why: a read-only disk)."""
    try:
        own_dir(str(d), make=False)
        own_dir(str(d / "ckpt"), make=False)
    except OSError:
        return not (d.is_symlink() or (d / "ckpt").is_symlink())
    return True


def _still_there(fd: int, path: Path) -> bool:
    """Whether the locked file ``fd`` is still the one at ``path`` (not moved to the trash)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


@contextlib.contextmanager
def unless_busy(store: RunStore, key: str) -> Iterator[bool]:
    """Hold run ``key``'s lock if no process holds it; yields whether the run may go."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    # a lock file another user made is taken read-only; none at all is a warning, and the
    # removal goes on (on a read-only disk it says why itself). A run gone meanwhile is
    # not made again by its lock: its removal finds nothing
    if not store.dir(key).is_dir():
        yield True
        return
    fd = open_lock(str(store.dir(key) / "lock"), f"runs gc's removal of run {key[:12]}")
    if fd is None:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False  # computing now
            return
        yield True
    finally:
        close_lock(fd)


def _clean_leftovers(root: Path) -> None:
    """Remove trash folders of a killed ``gc`` and temp files of a killed record write."""
    stale = time.time() - _STALE
    with contextlib.suppress(OSError), os.scandir(root) as it:
        for e in it:
            with contextlib.suppress(OSError):
                if _TRASH.match(e.name) and e.stat(follow_symlinks=False).st_mtime < stale:
                    shutil.rmtree(e.path, ignore_errors=True)
                elif is_key(e.name) and e.is_dir(follow_symlinks=False):
                    _clean_temps(e.path, stale)


def _clean_temps(directory: str, stale: float) -> None:
    with os.scandir(directory) as it:
        for e in it:
            if e.name.startswith(".") and e.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if e.stat(follow_symlinks=False).st_mtime < stale:
                        os.unlink(e.path)
