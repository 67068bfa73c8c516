"""Checkpoint integrity: a blake3 checksum over every byte, and a payload that fits.

A checkpoint file is the ``torch.save`` archive followed by a 48-byte trailer::

    <zip archive written by torch.save>  b"somatize-blake3\\n"  <32-byte blake3 of the archive>

The digest is computed while ``torch.save`` writes (each chunk is hashed as it goes to
the file), so saving reads nothing back; the disk writes each large chunk while it is
hashed, so the closing ``fsync`` waits for little. torch's own per-record CRC32 — which
``torch.load`` never checks — is switched off for these files: blake3 replaces it, and
costs less. ``torch.load`` reads the archive with the trailer in place (zip readers
find the archive's end record by searching backwards), so a checkpoint stays a plain
torch file.

Reading verifies the checksum before anything is unpickled. A file that ends in a zip
end record and has no trailer was written before checksums existed: it is loaded
unverified, with a warning (save again to protect it). Anything else — a trailer that
does not match, a file cut short, a damaged trailer — is a ``CheckpointError`` naming
the file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch
from blake3 import blake3

from ..errors import CheckpointError
from ..keepers import atomic_file, fsync_dir
from ..keepers.atomic import replace_with, start_writeback
from ..platforms import READ_NONBLOCK, blocking
from ..stack import outside
from . import ckptspare

__all__ = [
    "MAGIC",
    "check_payload",
    "verify_file",
    "write_checkpoint",
    "write_pointer",
]

MAGIC = b"somatize-blake3\n"
TRAILER = len(MAGIC) + 32
_EOCD = b"PK\x05\x06"  # a zip archive's end-of-central-directory record (22 bytes, no comment)
_CHUNK = 1 << 22
_WRITEBACK = 1 << 20  # after a chunk this large, the file so far is sent to the disk
_crc_lock = threading.Lock()


class _Hashing:
    """A write-only file for ``torch.save`` that hashes every chunk on its way to ``f``.

    A large chunk (a tensor's storage) is written first, its writeback to the disk
    started (``start_writeback``), and hashed while the disk takes it: the ``fsync``
    that ends the save then has little left to wait for.
    """

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.hash = f, blake3()
        self.error: OSError | None = None
        self.fd = f.fileno()
        self.written = self.started = 0  # bytes given to the OS; bytes sent to the disk

    def write(self, chunk: bytes | memoryview) -> int:
        try:
            n = self.f.write(chunk)
        except OSError as e:  # torch wraps it in a RuntimeError; keep the cause
            self.error = e
            raise
        self.written += len(chunk)
        if len(chunk) >= _WRITEBACK:  # ``f`` wrote it through, with whatever it buffered
            start_writeback(self.fd, self.started, self.written - self.started)
            self.started = self.written
        self.hash.update(chunk)
        return n

    def flush(self) -> None:
        self.f.flush()


@contextlib.contextmanager
def _without_crc32() -> Iterator[None]:
    """torch.save without its per-record CRC32 (blake3 covers every byte instead)."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None:  # an older torch: it computes the CRC, no harm
        yield
        return
    with _crc_lock:
        before = get()
        set_(False)
        try:
            yield
        finally:
            set_(before)


def _os_error(e: BaseException) -> OSError | None:
    """The OSError behind ``e`` (torch hides a failed write inside a RuntimeError)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _write_error(path: Path, cause: OSError, what: str = "checkpoint") -> CheckpointError:
    why = cause.strerror or str(cause)
    if isinstance(cause, IsADirectoryError):
        return CheckpointError(
            f"could not write {what} {path}: a directory is in its place ({why}); remove "
            "it (nothing the Trainer writes is a directory there) — earlier checkpoints "
            "and 'last' are untouched"
        )
    return CheckpointError(
        f"could not write {what} {path}: {why} ({type(cause).__name__}, errno "
        f"{cause.errno}); free space or permissions on {path.parent}, or checkpoint "
        "elsewhere — earlier checkpoints and 'last' are untouched"
    )


def write_checkpoint(
    path: Path, payload: Mapping[str, Any], *, sync_dir: bool = False, spare: Path | None = None
) -> None:
    """``torch.save`` ``payload`` to ``path`` atomically, with the blake3 trailer.

    The data is fsynced before the rename; the directory is not (``write_pointer``
    syncs it after ``last`` is renamed too) unless ``sync_dir``. ``spare``: a dropped
    checkpoint's file to write over instead of a new temp file, where ``ckptspare``
    allows it.

    Raises:
        CheckpointError: the disk is full, read-only, or refuses the write; names
            ``path`` and chains the OS error. Nothing existing is changed.
    """
    writer: _Hashing | None = None
    fd = ckptspare.open_spare(spare) if spare is not None else None
    try:
        with (
            ckptspare.written_over(fd, spare, path)
            if fd is not None and spare is not None
            else atomic_file(path, sync_dir=False)
        ) as f:  # straight to the file: no copy
            writer = _Hashing(f)
            with _without_crc32():
                torch.save(dict(payload), writer)  # type: ignore[arg-type]
            f.write(MAGIC + writer.hash.digest())
        if sync_dir:
            fsync_dir(path.parent)
    except (OSError, RuntimeError) as e:
        cause = (writer.error if writer is not None else None) or _os_error(e)
        if cause is None:
            raise
        raise _write_error(path, cause) from cause


def write_pointer(path: Path, name: str, *, sync_dir: bool = True) -> None:
    """Point ``path`` (``last``, ``best``) at ``name`` by a rename, then fsync the directory.

    The one directory fsync makes this rename and the checkpoint's durable together
    (``sync_dir=False``: the caller fsyncs it after its last rename). The pointer's
    few bytes are not fsynced themselves: a power loss can leave it empty, and an empty
    pointer means "the newest intact checkpoint" (``last()``).

    Raises:
        CheckpointError: an OS error (full or read-only disk), naming ``path``.
    """
    try:
        replace_with(str(path), [name.encode()], durable=False)  # temp file, rename: atomic
        if sync_dir:
            fsync_dir(path.parent)
    except OSError as e:
        raise _write_error(path, e, "checkpoint pointer") from e


@contextlib.contextmanager
def open_checkpoint(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for reading, never blocking: a FIFO or a device is refused.

    Raises:
        CheckpointError: nothing is there, it is not a regular file, or it cannot be read.
    """
    try:
        fd = os.open(path, READ_NONBLOCK)
    except FileNotFoundError as e:
        raise CheckpointError(
            f"no checkpoint at {path}; give the path of a checkpoint the Trainer wrote (a "
            "step-NNNNNNNNN.ckpt file in its Checkpointing dir)"
        ) from e
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise CheckpointError(
            f"{path} is a directory, not a checkpoint; pass one of its step-NNNNNNNNN.ckpt "
            f"files (st.Checkpointing({str(path)!r}).last() names the newest, .best_file() "
            f"the best), or resume='last' with checkpoint=st.Checkpointing({str(path)!r})"
        )
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointError(
            f"{path} is not a regular file (a FIFO, a device), not a checkpoint; pass a "
            "step-NNNNNNNNN.ckpt file the Trainer wrote, or remove it from the checkpoint "
            "directory"
        )
    blocking(fd)
    with os.fdopen(fd, "rb") as f:
        yield f


def verify_file(path: Path) -> bool:
    """Check ``path``'s checksum without unpickling anything (``verify_open``)."""
    with open_checkpoint(path) as f:
        return verify_open(path, f)


def verify_open(path: Path, f: BinaryIO) -> bool:
    """Check the checksum of ``f`` (``path``, open) without unpickling anything.

    Returns:
        True when the checksum matches; False for a file written before checksums
        (a complete zip archive with no trailer), which is then unverified.

    Raises:
        CheckpointError: the checksum does not match, the file is cut short, or it is
            neither a checkpoint with a trailer nor a zip archive.
    """
    try:
        size = os.fstat(f.fileno()).st_size
        tail = b""
        if size >= TRAILER:
            f.seek(size - TRAILER)
            tail = f.read(TRAILER)
        elif size:
            f.seek(0)
            tail = f.read()
        if tail[: len(MAGIC)] != MAGIC:
            if len(tail) >= 22 and tail[-22:-18] == _EOCD and tail[-2:] == b"\0\0":
                return False  # a complete archive from before checksums
            raise CheckpointError(
                f"{path} is truncated, corrupt or not a torch checkpoint (no checksum "
                "trailer and not a torch.save archive); resume from an earlier checkpoint"
            )
        f.seek(0)
        h, left, buf = blake3(), size - TRAILER, bytearray(min(_CHUNK, size))
        view = memoryview(buf)
        while left:
            n = f.readinto(view[: min(left, len(buf))])  # type: ignore[attr-defined]
            if not n:
                break
            h.update(view[:n])
            left -= n
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e
    if left or h.digest() != tail[len(MAGIC) :]:
        raise CheckpointError(
            f"{path} is corrupt: its contents do not match its blake3 checksum "
            f"(expected {tail[len(MAGIC) :].hex()[:16]}…, got {h.hexdigest()[:16]}…); "
            "resume from an earlier checkpoint"
        )
    return True


def warn_unverified(path: Path) -> None:
    warnings.warn(
        f"{path} has no checksum (written before somatize checksummed checkpoints); it was "
        "loaded unverified — save it again to protect it",
        UserWarning,
        stacklevel=outside(),
    )


# -- the payload's schema ---------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_TYPES: dict[str, tuple[str, Any]] = {
    "model": ("a state dict (name -> tensor)", lambda v: isinstance(v, Mapping)),
    "optimizer": ("an optimizer state dict", lambda v: isinstance(v, Mapping)),
    "scheduler": ("a scheduler state dict or None", lambda v: v is None or isinstance(v, Mapping)),
    "step": ("an int", _is_int),
    "epoch": ("an int", _is_int),
    "position": ("an int", _is_int),
    "examples_seen": ("an int", _is_int),
    "losses": ("a list of numbers", lambda v: isinstance(v, list) and all(map(_is_number, v))),
    "metrics": (
        "a list of dicts",
        lambda v: isinstance(v, list) and all(isinstance(m, Mapping) for m in v),
    ),
    "best": ("a number or None", lambda v: v is None or _is_number(v)),
    "pruned": ("a bool", lambda v: isinstance(v, bool)),
    "pruner": ("a state dict or None", lambda v: v is None or isinstance(v, Mapping)),
    "rng": ("a dict of RNG states", lambda v: isinstance(v, Mapping)),
    "seed": ("an int", _is_int),
}


def check_payload(payload: Mapping[str, Any], path: Path) -> None:
    """Every key a checkpoint holds is there, of its type, in range.

    Raises:
        CheckpointError: naming the file and every problem found.
    """
    problems = [f"missing {k!r}" for k in _TYPES if k not in payload]
    for key, (what, ok) in _TYPES.items():
        if key in payload and not ok(payload[key]):
            problems.append(f"{key!r} is {_show(payload[key])}, not {what}")
    if not problems:
        problems += _ranges(payload)
    if problems:
        raise CheckpointError(
            f"{path} is not a complete Trainer checkpoint: {'; '.join(problems)}; "
            "resume from a checkpoint the Trainer wrote"
        )


def _show(v: Any) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text[:60]}{'…' if len(text) > 60 else ''}"


def _ranges(p: Mapping[str, Any]) -> list[str]:
    problems = [f"{k!r}={p[k]} is negative" for k in ("step", "epoch", "examples_seen") if p[k] < 0]
    # Each batch read was trained on (at least one example each: several a step under
    # accumulate or micro-batches) or skipped for a non-finite loss.
    read = max(p["examples_seen"], 0) + (p["skipped"] if _is_int(p.get("skipped")) else 0)
    if not 0 <= p["position"] <= read:
        problems.append(
            f"'position'={p['position']} is out of range: a run that has trained on "
            f"{p['examples_seen']} examples and skipped {p.get('skipped', 0)} batches has read "
            f"0 to {read} batches of its epoch"
        )
    if not all(isinstance(t, torch.Tensor) for t in p["model"].values()):
        bad = next(k for k, t in p["model"].items() if not isinstance(t, torch.Tensor))
        problems.append(f"'model' entry {bad!r} is not a tensor")
    opt = p["optimizer"]
    if not isinstance(opt.get("state"), Mapping) or not isinstance(opt.get("param_groups"), list):
        problems.append("'optimizer' lacks 'state' or 'param_groups' (not an optimizer state)")
    rng = p["rng"]
    python = rng.get("python")
    if (
        not isinstance(python, (list, tuple))
        or len(python) != 3
        or not isinstance(python[1], torch.Tensor)
        or not isinstance(rng.get("torch"), torch.Tensor)
        or not isinstance(rng.get("cuda"), list)
    ):
        problems.append("'rng' lacks the python, torch or cuda RNG state")
    return problems
