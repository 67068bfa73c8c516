"""Checkpoints: written atomically, read with ``weights_only=True`` only.

A checkpoint is a plain ``torch.save`` file of tensors, numbers, strings, lists and
dicts (what it holds: ``capture.py``), so ``torch.load(..., weights_only=True)`` reads
it and never executes code from it. Each file is written to a temp file in the same
directory (inside a fit, over the file rotation dropped: ``ckptspare.py``), fsynced and
renamed into place; then the ``last`` pointer is renamed over, and the directory
fsynced once for both. A process killed at any instant leaves ``last`` naming a
complete checkpoint. Every file ends in a blake3 checksum of its
bytes (``integrity.py``), verified before anything is unpickled; ``last()`` falls
back to the newest intact checkpoint when the one ``last`` names is damaged.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..errors import CheckpointError
from ..keepers import fsync_dir
from . import ckptdir, ckptspare, integrity
from .capture import capture, finite, restore, restore_scaler, scaler_state
from .ckptdir import (
    FILE,
    check_name,
    checkpoint_files,
    newest_intact,
    orphans,
    read_pointer,
    remove,
    rotate,
    rotation,
)
from .ported import ported
from .rng import restore_rank_rng, rng_state, set_rng_state
from .run_state import RunState

__all__ = [
    "Checkpointing",
    "RunState",
    "capture",
    "finite",
    "load_checkpoint",
    "restore",
    "restore_rank_rng",
    "restore_scaler",
    "rng_state",
    "rotate",
    "scaler_state",
    "set_rng_state",
]

FORMAT = "somatize.checkpoint/1"


@dataclass(frozen=True)
class Checkpointing:
    """Where and how often the Trainer checkpoints, and which checkpoints it keeps.

    Files are ``step-NNNNNNNNN.ckpt`` (the optimizer step, nine digits); ``last`` names
    the newest, ``best`` the best by the Trainer's ``Options.monitor``. Rotation keeps the
    newest ``keep``, the ``best`` best (never rotated away by ``keep``), and the newest
    checkpoint whose weights are all finite.

    Args:
        dir: the checkpoint directory (created if missing).
        every_steps: also checkpoint every N optimizer steps (always at each epoch end,
            which writes that of a step ending the epoch).
        keep: how many of the most recent checkpoints to keep.
        best: how many of the best checkpoints to keep, ranked by ``Options.monitor``
            (``Options.mode`` says which way is better); an evaluation that ranks among
            them is checkpointed at once. 0: rank none.

    Example:
        >>> Checkpointing("runs/digits/ckpt", every_steps=100, keep=3, best=1).best
        1
    """

    dir: str | os.PathLike[str]
    every_steps: int | None = None
    keep: int = 3
    best: int = 0

    def __post_init__(self) -> None:
        from ..errors import SettingError
        from .settings import count

        if isinstance(self.dir, bool) or not isinstance(self.dir, (str, os.PathLike)):
            raise SettingError(
                f"Checkpointing(dir) takes the path of a directory (a str or a pathlib.Path), "
                f"not {self.dir!r}; e.g. st.Checkpointing('runs/digits/ckpt')"
            )
        if not str(os.fspath(self.dir)).strip():
            raise SettingError(
                "Checkpointing(dir='') is an empty path (an unset environment variable?), which "
                "would checkpoint into the current directory; pass a directory, e.g. "
                "st.Checkpointing('runs/digits/ckpt'), or '.' to mean the current one"
            )
        count("Checkpointing keep", self.keep, hint="it is how many recent checkpoints stay")
        count("Checkpointing best", self.best, 0, hint="it is how many best checkpoints stay")
        if self.every_steps is not None:
            count(
                "Checkpointing every_steps", self.every_steps, hint="pass None for epoch ends only"
            )

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def last(self) -> Path | None:
        """The newest intact checkpoint: the one ``last`` names, or None when there is none yet.

        When that file fails its checksum, the newest older checkpoint that passes is
        returned instead, with a warning naming both. An empty ``last`` (a fresh run's,
        or one a power cut emptied) names the newest intact checkpoint.

        Raises:
            CheckpointError: ``last`` names no checkpoint or cannot be read, no checkpoint
                is intact, or the directory holds checkpoints but no ``last`` (an earlier
                run's, which this run must not overwrite).
        """
        pointer = self.path / "last"
        name = read_pointer(pointer)
        if name is None:
            if files := checkpoint_files(self.path):
                raise orphans(self.path, files)
            return None
        if name:
            check_name(pointer, name)
        return newest_intact(self.path, name or None)

    def best_file(self) -> Path | None:
        """The checkpoint ``best`` names (the best by the monitored metric), or None."""
        try:
            name = read_pointer(self.path / "best")
        except CheckpointError:
            return None
        return self.path / name if name and FILE.match(name) else None

    def file(self, step: int) -> Path:
        """The checkpoint file of ``step``: ``step-NNNNNNNNN.ckpt`` in the directory."""
        return self.path / f"step-{step:09d}.ckpt"

    def save(
        self,
        payload: dict[str, Any],
        step: int,
        *,
        protect: Iterable[int] = (),
        best: int | None = None,
    ) -> Path:
        """Write ``payload`` as ``step-NNNNNNNNN.ckpt``, point ``last`` at it, drop old ones.

        Args:
            protect: steps whose checkpoints rotation keeps (the best, the last finite).
            best: the step of the best checkpoint, which ``best`` then names.

        Raises:
            CheckpointError: the disk is full or read-only (names the file, chains the
                OS error); earlier checkpoints and ``last`` are left as they were.
        """
        self.save_chain(payload, step, protect=protect, best=best, known=None)
        return self.file(step)

    def save_chain(
        self,
        payload: dict[str, Any],
        step: int,
        *,
        protect: Iterable[int],
        best: int | None,
        known: Iterable[str] | None,
    ) -> list[str]:
        """``save``, rotating only ``known``: the names of the run's earlier checkpoints
        (None: every checkpoint in the directory). Returns the run's checkpoints kept,
        oldest first, this one last (``payload["checkpoints"]`` in the file); those it
        drops once the file is written are ``payload["rotating"]``, which a run resumed
        from it deletes if a kill left them (``ckptdir.left_behind``). Inside a fit, one
        of them is kept as the spare the next save writes over (``ckptspare``)."""
        file = self.file(step)
        pointer = self.path / "last"
        if not pointer.exists():  # a fresh run's: its checkpoints never lie without one
            integrity.write_pointer(pointer, "")
        recycle, pointed = ckptspare.on(self.path), None
        if recycle:
            try:
                pointed = read_pointer(pointer)  # never made the spare (a power cut keeps it)
            except CheckpointError:
                recycle = False
        names = ckptdir.listing(self.path)  # once: for rotation and the sweep of temp files
        kept, doomed = rotation(
            self.path, self.keep, file.name, {self.file(p).name for p in protect}, known, names
        )
        spare = ckptspare.pick(names) if recycle else None
        integrity.write_checkpoint(
            file,
            {"format": FORMAT, **payload, "checkpoints": kept, "rotating": doomed},
            spare=None if spare is None else self.path / spare,
        )
        integrity.write_pointer(pointer, file.name, sync_dir=False)
        if best is not None and self.file(best).exists():
            integrity.write_pointer(self.path / "best", self.file(best).name, sync_dir=False)
        deleted = ckptspare.keep(self.path, doomed, pointed) if recycle else doomed
        fsync_dir(self.path)  # once: the file's, the pointers' and the spare's renames
        remove(self.path, deleted, names)
        return kept


Checkpointing.__init__ = ported("Checkpointing")(Checkpointing.__init__)  # type: ignore[method-assign]


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint written by the Trainer, with ``weights_only=True``.

    Its blake3 checksum is verified first; then the file is loaded memory-mapped (its
    tensors are copy-on-write views of the file, never written back) and its payload
    checked key by key. A file from before checksums loads with a warning.

    Raises:
        CheckpointError: the file is missing, truncated, corrupt (checksum mismatch),
            holds code (a pickle that is not weights-only is refused, never executed),
            is not a somatize checkpoint (or is one of another somatize version's
            format, which it names), or its payload lacks a key, has one of the
            wrong type or out of range (each named).
        TypeError: ``path`` is not a str or a path (None: what ``Checkpointing.last()``
            and ``best_file()`` return for a directory without that checkpoint).
    """
    if path is None:
        raise TypeError(
            "load_checkpoint takes the path of a checkpoint file (a str or a pathlib.Path), "
            "not None; e.g. st.load_checkpoint('runs/ckpt/step-000000100.ckpt'). None is what "
            "Checkpointing(dir).last() and .best_file() return when dir holds no such "
            "checkpoint: check the directory's path, and for best_file() that the run ranked "
            "its checkpoints, Checkpointing(dir, best=1) with a val= set"
        )
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"load_checkpoint takes the path of a checkpoint file (a str or a pathlib.Path), "
            f"not {path!r:.80}; e.g. st.load_checkpoint('runs/ckpt/step-000000100.ckpt')"
        )
    path = Path(path)
    with integrity.open_checkpoint(path) as f:  # one open file: what is verified is loaded
        ckptdir.refuse_pointer(path, f)
        verified = integrity.verify_open(path, f)
        f.seek(0)
        if not verified and not zipfile.is_zipfile(f):
            raise CheckpointError(
                f"{path} is truncated, corrupt or not a torch checkpoint (not a torch.save "
                "archive); resume from an earlier checkpoint"
            )
        payload = _load(path, f)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        e = CheckpointError(_not_this_format(path, payload))
        e.format = payload.get("format") if isinstance(payload, dict) else None  # type: ignore[attr-defined]
        raise e
    integrity.check_payload(payload, path)
    if not verified:
        integrity.warn_unverified(path)
    return payload


def _not_this_format(path: Path, payload: Any) -> str:
    """Why ``payload`` (loaded from ``path``) is not a checkpoint of this version: one of
    another somatize version's format, or a torch file that is no Trainer checkpoint."""
    found = payload.get("format") if isinstance(payload, dict) else None
    prefix, _, version = FORMAT.rpartition("/")
    if isinstance(found, str) and found.startswith(prefix + "/"):
        theirs = found.rpartition("/")[2]
        newer = theirs.isdigit() and int(theirs) > int(version)
        return (
            f"{path} is a somatize Trainer checkpoint of format {found!r}, written by "
            f"{'a newer' if newer else 'another'} version of somatize; this one reads "
            f"{FORMAT!r}. Load it with the version that wrote it"
            + (" (or upgrade somatize)" if newer else "")
            + "; its weights alone are "
            "torch.load(path, map_location='cpu', weights_only=True)['model'], for st.load_state"
        )
    return (
        f"{path} is a torch file but not a somatize Trainer checkpoint (no format "
        f"{FORMAT!r}); load it with torch.load, or resume from a Trainer checkpoint"
    )


def _load(path: Path, f: BinaryIO) -> Any:
    """``torch.load`` of the open, verified file ``f``, with ``weights_only=True``:
    memory-mapped through ``/proc/self/fd`` (the same file, whatever was renamed over
    ``path`` since), or read from ``f`` where there is no such directory."""
    fd_path = f"/proc/self/fd/{f.fileno()}"
    mmap = os.path.exists(fd_path)
    source: Any = fd_path if mmap else f
    f.seek(0)
    try:
        payload = torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # torch wraps every unpickling failure in one preamble; the reason is a later line
        lines = [ln for ln in str(e).splitlines()[1:] if ln.strip()]
        reason = lines[0] if lines else str(e).splitlines()[0]
        if "global" not in reason.lower():
            raise CheckpointError(
                f"{path} is corrupt and cannot be unpickled ({reason}); "
                "resume from an earlier checkpoint"
            ) from e
        raise CheckpointError(
            f"{path} was not loaded: its pickle asks for code a checkpoint never holds "
            f"(it may be malicious; weights_only=True refused it, nothing ran): {reason}"
        ) from e
    except Exception as e:  # a damaged archive fails in many ways inside torch.load
        raise CheckpointError(
            f"{path} is truncated or corrupt and cannot be read ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); resume from an earlier checkpoint"
        ) from e
    return payload
