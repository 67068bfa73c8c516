"""JsonLines on a resumed fit: each step and evaluation once, as CSVLog and TensorBoard keep
them; other runs in the file untouched; the rewrite atomic. The events are told here as
the Trainer tells them (tests/torch/test_run_log_torch.py fits with the Trainer itself)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from somatize import JsonLines
from somatize.run_log import JsonLines as Moved
from somatize.watchers import (
    CacheHit,
    EpochEnd,
    FitEnd,
    FitStart,
    Metrics,
    RunEnd,
    RunStart,
    StepEnd,
)
from somatize.watchers import JsonLines as Reexported

EPOCH = 4  # steps an epoch
STEPS = 12


class Killed(Exception):
    pass


def fit(
    log: JsonLines,
    run_id: str,
    *,
    until: int = STEPS,
    start: int = 0,
    evaluated: bool = False,
    position: int = 0,
    resuming: bool = False,
    graph: bool = False,
) -> None:
    """Tells ``log`` a fit's events as the Trainer orders them: ``FitStart``; each step's
    ``StepEnd`` and a node's ``Metrics`` (``graph``: the graph's ``RunStart``/``CacheHit``/
    ``RunEnd`` before them, without a step); at each epoch's end its evaluation and
    ``EpochEnd``; ``FitEnd``. Killed (no more events) after step ``until``'s, short of STEPS.
    Resumed inside an epoch at its last step (``position`` > 0), its end is made again."""
    log.on_event(FitStart(run_id, 3, 0, start, STEPS, position, evaluated, resuming))
    if position and start % EPOCH == 0:
        _epoch_end(log, run_id, start)
    for step in range(start + 1, until + 1):
        if graph:
            log.on_event(RunStart(run_id, 2))
            log.on_event(CacheHit(run_id, "body", f"key{step}"))
            log.on_event(RunEnd(run_id, 0.5))
        log.on_event(StepEnd(run_id, step, (step - 1) // EPOCH, 1 / step, 0.1, 8, 0.25))
        log.on_event(Metrics(run_id, "head", step, {"mean": step / 10}))
        if step % EPOCH == 0:
            _epoch_end(log, run_id, step)
    if until == STEPS:
        log.on_event(FitEnd(run_id, STEPS, STEPS // EPOCH, 3.0, False, {"loss": 1 / STEPS}))


def _epoch_end(log: JsonLines, run_id: str, step: int) -> None:
    log.on_event(Metrics(run_id, "", step, {"val_loss": 2 / step}))
    log.on_event(EpochEnd(run_id, step // EPOCH - 1, step, {"val_loss": 2 / step}))


def records(path: Path) -> list[dict[str, Any]]:
    """The log's records but its FitStarts, without what differs from run to run."""
    return [
        {k: v for k, v in r.items() if k not in ("time", "run_id")}
        for r in JsonLines.read(path)
        if r["event"] != "FitStart"
    ]


def starts(path: Path) -> list[int]:
    return [r["start_step"] for r in JsonLines.read(path) if r["event"] == "FitStart"]


def straight(tmp_path: Path, graph: bool = False) -> list[dict[str, Any]]:
    path = tmp_path / "straight.jsonl"
    path.unlink(missing_ok=True)
    fit(JsonLines(path), "s", graph=graph)
    return records(path)


def test_the_run_log_moved_beside_the_watchers_and_is_still_theirs() -> None:
    assert JsonLines is Moved is Reexported


# (killed after, checkpoint at, its position, evaluated): a checkpoint at an epoch's end
# (after its evaluation), mid-epoch, and mid-epoch at the epoch's last step (written before
# the epoch's end, which the process did not survive: its evaluation is not in it)
CASES = [(7, 4, 0, True), (7, 6, 2, False), (4, 4, 4, False)]


@pytest.mark.parametrize(("killed", "at", "position", "evaluated"), CASES)
@pytest.mark.parametrize("graph", [False, True], ids=["trainer", "graph-too"])
def test_a_resumed_run_logs_each_step_once_as_an_uninterrupted_run(
    tmp_path: Path, killed: int, at: int, position: int, evaluated: bool, graph: bool
) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "a", until=killed, graph=graph)
    if graph:  # killed inside the next step: its graph run began
        JsonLines(path).on_event(RunStart("a", 2))
    fit(JsonLines(path), "b", start=at, position=position, evaluated=evaluated, graph=graph)
    assert records(path) == straight(tmp_path, graph)
    assert starts(path) == [0, at]  # the attempts' FitStarts stay
    evals = [r["step"] for r in records(path) if r["event"] == "Metrics" and r["node"] == ""]
    assert evals == [4, 8, 12]


def test_an_evaluation_at_the_checkpoint_step_is_kept_when_the_checkpoint_holds_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "a", until=4)  # killed after the evaluation of step 4
    fit(JsonLines(path), "b", until=4, start=4, evaluated=True)  # its checkpoint holds it
    kept = [(r["event"], r["run_id"]) for r in JsonLines.read(path) if r.get("step") == 4]
    assert kept == [("StepEnd", "a"), ("Metrics", "a"), ("Metrics", "a"), ("EpochEnd", "a")]
    fit(JsonLines(path), "c", until=4, start=4, position=4)  # its checkpoint does not
    again = [(r["event"], r["run_id"]) for r in JsonLines.read(path) if r.get("step") == 4]
    assert again == [*kept[:2], ("Metrics", "c"), ("EpochEnd", "c")]


def test_a_chain_of_resumes_keeps_one_of_each(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "a", until=7)  # checkpoint at 6
    fit(JsonLines(path), "b", until=11, start=6, position=2)  # checkpoint at 10
    fit(JsonLines(path), "c", start=10, position=2)
    assert records(path) == straight(tmp_path)
    assert starts(path) == [0, 6, 10]


def test_a_resume_from_an_earlier_checkpoint_drops_the_attempts_after_it(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "a", until=7)
    fit(JsonLines(path), "b", until=11, start=6, position=2)
    fit(JsonLines(path), "c", start=5, position=1)  # resume=path: an older checkpoint
    assert records(path) == straight(tmp_path)
    assert starts(path) == [0, 5]  # b began after step 5: its FitStart went too
    assert {r["run_id"] for r in JsonLines.read(path) if r.get("step", 0) > 5} == {"c"}


def test_a_log_written_before_the_rewrite_is_trimmed_at_its_next_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.jsonl"
    with monkeypatch.context() as m:  # as JsonLines wrote before it dropped anything
        m.setattr(JsonLines, "_supersede", lambda self, start: None)
        fit(JsonLines(path), "a", until=7)
        JsonLines(path).on_event(RunStart("a", 2))  # killed inside step 8
        fit(JsonLines(path), "b", until=11, start=6, position=2)
    assert sum(r["event"] == "StepEnd" for r in JsonLines.read(path)) == 12  # 7 twice
    fit(JsonLines(path), "c", start=10, position=2)
    assert records(path) == straight(tmp_path)


def test_killed_before_its_first_checkpoint_and_fitted_again_its_attempt_is_gone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "earlier")  # another run, which ended
    before = path.read_bytes()
    fit(JsonLines(path), "a", until=2, graph=True)  # no checkpoint yet
    fit(JsonLines(path), "b", resuming=True)  # resume="last" found none
    assert path.read_bytes().startswith(before)
    assert {r["run_id"] for r in JsonLines.read(path)} == {"earlier", "b"}
    assert records(path) == straight(tmp_path) * 2


def test_a_run_that_ended_is_not_replaced_by_a_resume_that_found_no_checkpoint(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "earlier")  # (a script passing resume="last" to every run)
    fit(JsonLines(path), "next", resuming=True)
    assert [r["run_id"] for r in JsonLines.read(path) if r["event"] == "FitStart"] == [
        "earlier",
        "next",
    ]


def test_two_runs_in_one_file_the_second_resumed_leaves_the_first_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "first")
    first = path.read_bytes()
    fit(JsonLines(path), "second", until=7)
    fit(JsonLines(path), "second'", start=6, position=2)
    assert path.read_bytes().startswith(first)
    assert records(path) == straight(tmp_path) * 2


@pytest.mark.parametrize("ended", [False, True], ids=["killed", "ended"])
def test_a_resume_of_a_run_logged_elsewhere_leaves_the_last_run_here(
    tmp_path: Path, ended: bool
) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "here", until=STEPS if ended else 3)
    before = path.read_bytes()
    # a run at step 6 (killed: the log holds no step 6; ended: it ended past step 6)
    fit(JsonLines(path), "elsewhere", start=6, position=2)
    assert path.read_bytes().startswith(before)


def test_a_run_resumed_twice_after_another_resumed_here_leaves_that_one(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "x", start=20, until=25)  # (its steps before 20 logged elsewhere)
    before = path.read_bytes()
    fit(JsonLines(path), "y", start=6, until=9, position=2)  # and y's before 6
    fit(JsonLines(path), "y'", start=8, position=0)  # y resumed again
    assert path.read_bytes().startswith(before)  # x is not y's: steps past 8, and kept
    assert [r["step"] for r in JsonLines.read(path) if r["event"] == "StepEnd"] == [
        *range(21, 26),
        *range(7, 13),
    ]


def test_lines_that_are_not_records_torn_go_altered_stay(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "a", until=5)
    with open(path, "ab") as f:
        f.write(b'{"altered": 1}}\n{"event": "StepEnd", "step": 6, "lo')  # a torn tail
    fit(JsonLines(path), "b", start=4, evaluated=True)
    lines = path.read_bytes().splitlines()
    assert b'{"altered": 1}}' in lines and not any(line.endswith(b'"lo') for line in lines)
    with pytest.raises(ValueError, match=r"run\.jsonl, line \d+: not a JSON record"):
        JsonLines.read(path)  # (as before: the altered line is named for the user to delete)


def test_nothing_to_drop_leaves_the_file_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "a", until=4)
    inode = path.stat().st_ino
    fit(JsonLines(path), "b", start=4, evaluated=True)  # killed right after its checkpoint
    assert path.stat().st_ino == inode  # appended to, not rewritten
    assert records(path) == straight(tmp_path)


def test_the_rewrite_goes_through_a_temp_file_a_failure_leaves_the_log_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import somatize.keepers.atomic as atomic

    path = tmp_path / "run.jsonl"
    fit(JsonLines(path), "a", until=7)
    before = path.read_bytes()
    written: list[bytes] = []

    def fail(src: str, dst: Path) -> None:  # between the temp file's write and its rename
        written.append(Path(src).read_bytes())
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "replace", fail)
    log = JsonLines(path)
    with pytest.raises(OSError, match=r"could not rewrite .*run\.jsonl .*the log is as it was"):
        log.on_event(FitStart("b", 3, 0, 6, STEPS, 2, False, True))
    assert path.read_bytes() == before  # whole: the new file was never renamed over it
    assert written and before.startswith(written[0]) and len(written[0]) < len(before)
    assert os.listdir(tmp_path) == ["run.jsonl"]  # the temp file removed
    monkeypatch.undo()
    log.on_event(FitStart("b", 3, 0, 6, STEPS, 2, False, True))  # it goes through next time
    assert JsonLines.read(path)[-1]["run_id"] == "b"
    assert max(r.get("step", 0) for r in JsonLines.read(path)) == 6
