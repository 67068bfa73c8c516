"""A remembered run's directory is the store's own (runs_files.py): a link planted at a
predicted ``remembered/<key>`` (or its ``ckpt/``) is replaced, never written through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from somatize import runs

KEY = "c" * 64
LINKED = "was a symbolic link .* a remembered run keeps a directory of its own"


def _planted(tmp_path: Path) -> tuple[runs.RunStore, Path, Path]:
    """A store whose ``remembered/<KEY>`` links to a folder outside it holding a file."""
    root, outside = tmp_path / "cache" / runs.FOLDER, tmp_path / "outside"
    root.mkdir(parents=True)
    outside.mkdir()
    (outside / "run.json").write_text("the victim's file")
    os.symlink(outside, root / KEY)
    return runs.RunStore(root), root, outside


def _untouched(outside: Path) -> bool:
    return [p.name for p in outside.iterdir()] == ["run.json"] and (
        outside / "run.json"
    ).read_text() == "the victim's file"


def test_a_link_planted_at_a_predicted_run_directory_is_replaced_never_written_through(
    tmp_path: Path,
) -> None:
    # found by the security audit: the record, the lock and checkpoints went where it pointed
    store, root, outside = _planted(tmp_path)
    assert store.record(KEY) is None  # (a linked directory is no run: never recalled)
    with pytest.warns(UserWarning, match=LINKED), store.lock(KEY) as locked:
        assert locked
        store.write(KEY, {"status": "started", "function": "m.train"})
    assert _untouched(outside)
    assert not (root / KEY).is_symlink() and (root / KEY / "lock").is_file()
    record = store.record(KEY)
    assert record is not None and record["status"] == "started"


def test_a_record_written_without_the_lock_replaces_the_link_too(tmp_path: Path) -> None:
    store, root, outside = _planted(tmp_path)
    with pytest.warns(UserWarning, match=LINKED):
        store.write(KEY, {"status": "done", "function": "m.train"})
    assert _untouched(outside) and not (root / KEY).is_symlink()
    record = store.record(KEY)
    assert record is not None and record["status"] == "done"


def test_a_link_planted_at_a_runs_checkpoint_folder_is_removed(tmp_path: Path) -> None:
    root, outside = tmp_path / runs.FOLDER, tmp_path / "outside"
    outside.mkdir()
    (outside / "step-000000001.ckpt").write_bytes(b"the victim's")
    (root / KEY).mkdir(parents=True)
    os.symlink(outside, root / KEY / "ckpt")
    store = runs.RunStore(root)
    with pytest.warns(UserWarning, match=LINKED), store.lock(KEY) as locked:
        assert locked
    assert not store.checkpoints(KEY).exists()  # (made by the run's first checkpoint)
    assert [p.name for p in outside.iterdir()] == ["step-000000001.ckpt"]


def test_a_run_directory_of_its_own_is_kept_as_it_is_without_a_warning(tmp_path: Path) -> None:
    store = runs.RunStore(tmp_path / runs.FOLDER)
    with store.lock(KEY) as locked:  # (warnings are errors here)
        assert locked
        store.write(KEY, {"status": "started"})
    (store.checkpoints(KEY)).mkdir()
    (store.checkpoints(KEY) / "step-000000001.ckpt").write_bytes(b"kept")
    with store.lock(KEY):
        store.write(KEY, {"status": "done"})
    assert (store.checkpoints(KEY) / "step-000000001.ckpt").read_bytes() == b"kept"
    assert (store.record(KEY) or {})["status"] == "done"
