"""Damaged run records (runs.py, runs_cli.py): a run.json that is valid JSON with a field of
the wrong type is reported by its path, and kept by gc — never a traceback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from somatize import DiskKeeper, runs
from somatize.cli import main

OLD = time.time() - 90 * 86400
A, B = "a" * 64, "b" * 64

DAMAGE: list[tuple[dict[str, Any] | str, str]] = [
    ({"metrics": None}, "its field 'metrics' is a NoneType (None), not a dict"),
    ({"summary": None}, "its field 'summary' is a NoneType (None), not a dict"),
    ({"result": None}, "its field 'result' is a NoneType (None), not a dict"),
    ({"result": [1]}, "its field 'result' is a list ([1]), not a dict"),
    ({"bytes": "x"}, "its field 'bytes' is a str ('x'), not a count of bytes"),
    ({"bytes": -5}, "its field 'bytes' is an int (-5), not a count of bytes"),
    ({"bytes": True}, "its field 'bytes' is a bool (True), not a count of bytes"),
    ({"status": 3}, "its field 'status' is an int (3), not a str"),
    ({"format": "somatize.run/9"}, "its format is 'somatize.run/9', not 'somatize.run/1'"),
    ("[1, 2]", "it is not a run record (a list, not a JSON object)"),
    ("{not json", "it cannot be read as JSON (Expecting property name"),
]


def _run(root: Path, key: str, keeper: DiskKeeper, change: dict[str, Any] | str = "") -> Path:
    """A finished run under ``root`` (a keeper's remembered/), its record changed so."""
    d = root / key
    (d / "ckpt").mkdir(parents=True)
    (d / "ckpt" / "step-000000001.ckpt").write_bytes(b"c" * 500)
    record = {"format": runs.FORMAT, "key": key, "status": "done", "function": "m.train"}
    record |= {"summary": {"seed": "1"}, "bytes": 1000, "metrics": {"val_loss": 0.5}}
    record |= {"result": {"final_loss": 0.25}}
    text = change if isinstance(change, str) and change else json.dumps(record | (change or {}))
    (d / "run.json").write_text(text)  # type: ignore[arg-type]
    os.utime(d / "run.json", (OLD, OLD))
    keeper.put(key, b"x" * 1000)
    return d


@pytest.fixture
def keeper(tmp_path: Path) -> DiskKeeper:
    return DiskKeeper(tmp_path / "cache")


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["runs", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(("change", "why"), DAMAGE)
def test_a_damaged_record_is_listed_as_damaged_with_its_path_and_recalled_by_its_status(
    keeper: DiskKeeper, change: dict[str, Any] | str, why: str
) -> None:
    root = keeper.path / runs.FOLDER
    _run(root, A, keeper, change)
    store = runs.RunStore(root)
    record = store.record(A)
    if isinstance(change, dict) and set(change) <= {"metrics", "summary", "result", "bytes"}:
        # a field only shown or summed: the finished run is still recalled, not recomputed
        assert record is not None and record["status"] == "done"
    else:  # no run record: st.remember computes it again, and writes a new record
        assert record is None
    (listed,) = store.records()
    assert listed["status"] == "damaged" and listed["key"] == A
    assert listed["record"] == str(root / A / "run.json") and listed["damage"].startswith(why)


@pytest.mark.parametrize(("change", "why"), DAMAGE)
def test_runs_ls_show_and_gc_report_a_damaged_record_and_gc_keeps_its_run(
    keeper: DiskKeeper, capsys: pytest.CaptureFixture[str], change: dict[str, Any] | str, why: str
) -> None:
    root = keeper.path / runs.FOLDER
    damaged, intact = _run(root, A, keeper, change), _run(root, B, keeper)
    where = ["--dir", str(keeper.path)]
    rc, out, err = cli(["ls", *where], capsys)
    assert rc == 0
    line = next(line for line in out.splitlines() if line.startswith(A[:12]))
    assert f"damaged record {damaged / 'run.json'}: {why}" in line
    assert out.splitlines()[-1].startswith("2 runs (1 finished, 1 with a damaged record), ")
    assert "gc keeps them" in err and "mend each run.json" in err
    assert "somatize: 1 damaged run record, shown above" in err

    rc, out, err = cli(["show", A[:8], *where], capsys)
    assert rc == 1 and json.loads(out)["status"] == "damaged"
    assert f"somatize: the record of run {A[:12]} is damaged ({why}" in err
    assert str(damaged / "run.json") in err and f"remove {damaged}" in err

    rc, out, err = cli(["gc", "--older-than", "1d", "--max-bytes", "0", *where], capsys)
    assert rc == 0 and f"removed {B[:12]}" in out and "removed 1 run; 1 left" in out
    assert f"kept {A[:12]}: its record is damaged ({why}" in out
    assert f"mend {damaged / 'run.json'}" in out and f"remove {damaged} by hand" in out
    assert damaged.is_dir() and not intact.exists()
    assert {A} == set(keeper.keys())  # its result stays with it


def test_gc_keeps_what_it_cannot_judge_and_removes_a_run_killed_before_its_record(
    keeper: DiskKeeper,
) -> None:
    root = keeper.path / runs.FOLDER
    damaged = _run(root, A, keeper, {"bytes": "x"})
    killed = root / B  # (a directory with no run.json: killed before it wrote one)
    (killed / "ckpt").mkdir(parents=True)
    os.utime(killed, (OLD, OLD))
    removed = runs.gc(keeper.path, older_than=0, max_bytes=0)
    assert [r["key"] for r in removed] == [B] and removed[0]["status"] == "unknown"
    assert damaged.is_dir() and not killed.exists()


def test_gc_keeps_a_run_whose_record_this_user_cannot_read(
    keeper: DiskKeeper, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _run(keeper.path / runs.FOLDER, A, keeper)
    real = os.open

    def denied(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(path) == "run.json":  # another user's store, mode 0600
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    rc, out, _ = cli(["gc", "--older-than", "0", "--dir", str(keeper.path)], capsys)
    assert rc == 0 and "removed 0 runs; 1 left" in out
    assert f"kept {A[:12]}: this user cannot read its record {d / 'run.json'}" in out
    assert d.is_dir()


def test_a_fifo_or_a_huge_file_for_a_record_is_damaged_never_a_hang_or_a_full_memory(
    keeper: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an outside audit: run.json was read with a plain read_text: a FIFO in its
    place hung `runs ls`, and a sparse file of gigabytes was read whole into memory."""
    import signal
    import tracemalloc

    root = keeper.path / runs.FOLDER
    fifo, huge = _run(root, A, keeper) / "run.json", _run(root, B, keeper) / "run.json"
    fifo.unlink()
    os.mkfifo(fifo)
    with open(huge, "r+b") as f:
        f.truncate(runs.RECORD_BYTES + 1)

    def hung(signum: int, frame: Any) -> None:
        raise AssertionError("reading a run record blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    tracemalloc.start()
    try:
        rc, out, _ = cli(["ls", "--dir", str(keeper.path)], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert rc == 0 and peak < runs.RECORD_BYTES // 2
    assert f"damaged record {fifo}: it cannot be read as JSON (it is not a regular file)" in out
    assert f"damaged record {huge}: it cannot be read as JSON (it is over" in out


def test_a_linked_run_directory_is_no_run_of_the_store(
    keeper: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an outside audit: a link planted under remembered/ was listed as a run,
    sized by walking wherever it points (a link to / walks the disk), and `runs gc` made
    its lock file there."""
    elsewhere = keeper.path.parent / "elsewhere"
    elsewhere.mkdir()
    root = keeper.path / runs.FOLDER
    _run(root, A, keeper)
    os.symlink(elsewhere, root / B)
    assert [r["key"] for r in runs.RunStore(root).records()] == [A]
    rc, out, _ = cli(["gc", "--older-than", "0", "--dir", str(keeper.path)], capsys)
    assert rc == 0 and "removed 1 run; 0 left" in out
    assert list(elsewhere.iterdir()) == [] and (root / B).is_symlink()


def test_gc_removes_only_trash_folders_of_its_own_naming(keeper: DiskKeeper) -> None:
    root = keeper.path / runs.FOLDER
    _run(root, A, keeper)
    ours, other = root / f".trash-{B}-123", root / ".trash-notes"
    for d in (ours, other):
        d.mkdir()
        os.utime(d, (OLD, OLD))
    runs.gc(keeper.path, older_than=30 * 86400)
    assert not ours.exists() and other.is_dir()


def test_runs_ls_prints_a_records_control_characters_escaped(
    keeper: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an outside audit: a record's fields were printed as they are, so an escape
    sequence in a run.json someone else wrote was obeyed by the terminal."""
    _run(keeper.path / runs.FOLDER, A, keeper, {"function": "m.f\x1b]0;owned\x07\nforged"})
    rc, out, _ = cli(["ls", "--dir", str(keeper.path)], capsys)
    assert rc == 0 and "\x1b" not in out and "\x07" not in out
    assert "f\\x1b]0;owned\\x07\\nforged(seed=1)" in out
