"""``somatize runs`` (runs_cli.py): where --dir finds the runs, and what it says of their results."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from somatize import DiskKeeper, runs
from somatize.cli import main

OLD = time.time() - 90 * 86400
A, B = "a" * 64, "b" * 64


def _run(root: Path, key: str, keeper: DiskKeeper | None) -> Path:
    """A finished run as st.remember leaves it: its record under ``root``, its result in
    ``keeper``."""
    d = root / key
    d.mkdir(parents=True)
    (d / "ckpt").mkdir()
    record = {"format": runs.FORMAT, "key": key, "status": "done", "function": "m.train"}
    record |= {"summary": {"seed": key[0]}, "bytes": 1000, "metrics": {"val_loss": 0.5}}
    (d / "run.json").write_text(json.dumps(record))
    os.utime(d / "run.json", (OLD, OLD))
    if keeper is not None:
        keeper.put(key, b"x" * 1000)
    return d


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["runs", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_runs_stored_with_a_dir_of_their_own_are_listed_shown_and_gcd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # st.remember(fn, keeper=DiskKeeper(K), dir=myruns): records in myruns/<key>, results in K
    keeper, mine = DiskKeeper(tmp_path / "K"), tmp_path / "myruns"
    _run(mine, A, keeper)
    _run(mine, B, keeper)
    rc, out, _ = run(["ls", "--dir", str(mine)], capsys)
    assert rc == 0 and out.splitlines()[-1].startswith("2 runs (2 finished), ")
    assert f"{A[:12]}" in out and "train(seed=a)  val_loss=0.5" in out
    assert re.search(rf"{A[:12]} +\S+ \S+  \d{{4}}-\d\d-\d\d \d\d:\d\d  train\(seed=a\)", out)
    rc, out, _ = run(["show", "bbb", "--dir", str(mine)], capsys)
    assert rc == 0 and json.loads(out)["key"] == B
    # the keeper's directory has no remembered/: nothing there, said as before
    rc, _, err = run(["ls", "--dir", str(keeper.path)], capsys)
    assert rc == 2 and "no remembered runs under" in err
    assert "runs stored with st.remember(..., dir=DIR) are in DIR: pass --dir DIR" in err

    rc, out, _ = run(["gc", "--older-than", "30d", "--dir", str(mine)], capsys)
    assert rc == 0 and "removed 2 runs; 0 left" in out
    assert "pass --keeper DIR to remove them too" in out
    assert not (mine / A).exists() and sorted(keeper.keys()) == [A, B]  # the keeper unknown

    _run(mine, A, keeper)
    rc, out, _ = run(
        ["gc", "--older-than", "30d", "--dir", str(mine), "--keeper", str(keeper.path)], capsys
    )
    assert rc == 0 and "removed 1 run; 0 left" in out and "--keeper" not in out
    assert sorted(keeper.keys()) == [B]  # A's result went with its run


def test_show_without_one_matching_key_and_gc_without_a_limit_say_what_to_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "myruns"
    _run(mine, A, None)
    _run(mine, "a" + "c" * 63, None)  # two keys starting "a"
    rc, _, err = run(["show", "--dir", str(mine)], capsys)
    assert rc == 2 and "needs a KEY (a prefix works), e.g. somatize runs show" in err
    rc, _, err = run(["show", "a", "--dir", str(mine)], capsys)
    assert rc == 2 and "2 runs have a key starting 'a'; give more of the key" in err
    rc, _, err = run(["show", "f", "--dir", str(mine)], capsys)
    assert rc == 2 and "0 runs have a key starting 'f'; somatize runs ls lists" in err
    rc, _, err = run(["gc", "--dir", str(mine)], capsys)
    assert rc == 2 and "e.g. somatize runs gc --older-than 30d" in err


def test_a_keeper_that_is_not_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path / "myruns", A, None)
    rc, _, err = run(["ls", "--dir", str(tmp_path / "myruns"), "--keeper", str(tmp_path)], capsys)
    assert rc == 2 and "is not a keeper's directory (it has no objects/)" in err


def test_a_finished_run_whose_result_was_collected_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keeper = DiskKeeper(tmp_path / "runs")  # the default layout: runs/remembered/<key>
    _run(keeper.path / runs.FOLDER, A, keeper)
    _run(keeper.path / runs.FOLDER, B, keeper)
    keeper.discard(A)  # as `somatize cache gc --max-bytes 0` leaves it
    rc, out, _ = run(["ls", "--dir", str(keeper.path)], capsys)
    lines = out.splitlines()
    assert rc == 0 and lines[-1].startswith(
        "2 runs (2 finished, 1 of them with the result collected)"
    )
    gone = next(line for line in lines if line.startswith(A[:12]))
    assert gone.endswith("val_loss=0.5  (result collected (cache gc): the next call computes it "
                         "again, from its checkpoints)")  # fmt: skip
    assert "collected" not in next(line for line in lines if line.startswith(B[:12]))
    rc, out, _ = run(["show", A[:8], "--dir", str(keeper.path)], capsys)
    shown = json.loads(out)
    assert shown["status"] == "done" and shown["collected"].startswith("result collected")
    rc, out, _ = run(["show", B[:8], "--dir", str(keeper.path)], capsys)
    assert "collected" not in json.loads(out)


def test_a_pruned_or_timed_out_run_is_listed_as_such_not_as_a_plain_finished_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keeper = DiskKeeper(tmp_path / "runs")
    root = keeper.path / runs.FOLDER
    for key, result in [
        (A, {"pruned": True, "pruned_reason": "pruned by Trial", "final_loss": 1.5}),
        (B, {"timed_out": True, "pruned": False}),
        ("c" * 64, {"pruned": False, "timed_out": False}),
    ]:
        record = json.loads((_run(root, key, keeper) / "run.json").read_text())
        (root / key / "run.json").write_text(json.dumps({**record, "result": result}))
    rc, out, _ = run(["ls", "--dir", str(keeper.path)], capsys)
    lines = {line[:1]: line for line in out.splitlines()}
    assert rc == 0
    assert lines["a"].endswith("loss=1.5 val_loss=0.5  (pruned: pruned by Trial)")
    assert lines["b"].endswith("val_loss=0.5  (timed out: Options(max_time=))")
    assert lines["c"].endswith("train(seed=c)  val_loss=0.5")
    assert out.splitlines()[-1].startswith("3 runs (3 finished, 1 pruned, 1 timed out)")
