"""``somatize checkpoint verify DIR``: check every checkpoint of a directory.

Each ``*.ckpt`` file is checked as ``load_checkpoint`` would (checksum, then the
payload key by key, nothing executed); the pointers ``last`` and ``best`` must name a
file that passed, and ``last`` must be there: without it ``fit(resume="last")`` refuses
the directory. Nothing is written or removed.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from ..printable import printable
from .checkpoint import load_checkpoint
from .ckptdir import FILE, read_pointer

__all__ = ["Verdict", "verify_checkpoints", "verify_command"]


@dataclass(frozen=True)
class Verdict:
    """One file's verdict: ``"ok"``, ``"unverified"`` (no checksum), ``"damaged"``,
    ``"missing"`` (a ``last`` pointer absent beside checkpoints), or ``"other"`` (intact,
    of another somatize version's format: that version reads it)."""

    path: Path
    status: str
    detail: str = ""


def verify_checkpoints(path: str | os.PathLike[str]) -> list[Verdict]:
    """Verify a checkpoint file, or every ``*.ckpt`` file and pointer of a directory.

    Raises:
        CheckpointError: ``path`` is neither a checkpoint file nor a directory, or is a
            directory holding no ``*.ckpt`` file (a wrong directory must not pass).
    """
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".ckpt" and not p.is_dir())
        if not files:
            raise CheckpointError(
                f"no checkpoint in {path}: it holds no *.ckpt file; give the directory passed "
                "to st.Checkpointing(dir), or one checkpoint file"
            )
    else:
        raise CheckpointError(
            f"no checkpoint or checkpoint directory at {path}; give a checkpoint file "
            "(step-NNNNNNNNN.ckpt) or the directory passed to st.Checkpointing(dir)"
        )
    verdicts = [_verify(f) for f in files]
    if path.is_dir():
        passed = {v.path.name for v in verdicts if v.status != "damaged"}
        for pointer in ("last", "best"):
            try:
                name = read_pointer(path / pointer)
            except CheckpointError as e:
                verdicts.append(Verdict(path / pointer, "damaged", str(e)))
                continue
            if name is None and pointer == "last" and any(FILE.match(f.name) for f in files):
                # as Checkpointing.last() refuses it (a file of another name is not the run's)
                verdicts.append(
                    Verdict(path / pointer, "missing", _no_last(path / pointer, passed))
                )
                continue
            if not name:  # absent, or empty (a power cut): "last" then names the newest intact
                continue
            if name not in passed:
                why = "a damaged checkpoint" if (path / name).is_file() else "no checkpoint"
                verdicts.append(Verdict(path / pointer, "damaged", f"names {name!r}: {why}"))
    return verdicts


def _no_last(pointer: Path, passed: set[str]) -> str:
    newest = max((n for n in passed if FILE.match(n)), default=None)
    fix = (
        f"write the name of one into it to continue from it (echo {newest} > {pointer})"
        if newest
        else "write the name of an intact checkpoint into it"
    )
    return (
        "absent beside the checkpoints, so fit(..., resume='last') refuses the directory "
        f"(and a fresh fit will not write over them); {fix}, or resume from a file: resume=PATH"
    )


def _verify(file: Path) -> Verdict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            load_checkpoint(file)
        except CheckpointError as e:
            other = str(getattr(e, "format", None) or "").startswith("somatize.checkpoint/")
            return Verdict(file, "other" if other else "damaged", str(e))
    unverified = any("no checksum" in str(w.message) for w in caught)
    return Verdict(file, "unverified" if unverified else "ok", "no checksum" if unverified else "")


def verify_command(path: str) -> int:
    """Print a verdict per file; exit status 1 when any file is damaged or ``last`` is
    missing, 2 when there is no checkpoint to verify."""
    try:
        verdicts = verify_checkpoints(path)
    except CheckpointError as e:
        print(printable(f"somatize: {e}"), file=sys.stderr)
        return 2
    for v in verdicts:
        # (file names and pointers are the directory's: printable, whoever wrote it)
        print(printable(f"{v.status:<10} {v.path}" + (f": {v.detail}" if v.detail else "")))
    damaged = sum(v.status == "damaged" for v in verdicts)
    missing = sum(v.status == "missing" for v in verdicts)
    other = sum(v.status == "other" for v in verdicts)
    print(
        f"{len(verdicts)} checked: {damaged} damaged, "
        + (f"{missing} missing, " if missing else "")
        + (f"{other} of another somatize version, " if other else "")
        + f"{sum(v.status == 'unverified' for v in verdicts)} without a checksum"
    )
    return 1 if damaged or missing else 0
