"""Watchers: narrow frozen events, told in order; Recorder and the JSON-lines run log."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest

from somatize import Ctx, Done, Graph, JsonLines, Node, Recorder, Watcher
from somatize.watchers import (
    CacheHit,
    CacheMiss,
    Event,
    Metrics,
    NodeEnd,
    NodeStart,
    RunEnd,
    RunStart,
)


class Inc(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + 1, metrics={"x": x})


def kinds(events: list[Event]) -> list[str]:
    return [
        type(e).__name__ + (f":{e.node}" if hasattr(e, "node") else "")  # type: ignore[attr-defined]
        for e in events
    ]


def test_events_of_a_run_in_order() -> None:
    rec = Recorder()
    g = Graph.somatize(Inc() >> Inc(), watchers=[rec]).cache("inc_2")
    g.run(1, run_id="r1", step=7)
    assert kinds(rec.events) == [
        "RunStart",
        "NodeStart:inc",
        "NodeEnd:inc",
        "Metrics:inc",
        "CacheMiss:inc_2",
        "NodeStart:inc_2",
        "NodeEnd:inc_2",
        "Metrics:inc_2",
        "RunEnd",
    ]
    assert {e.run_id for e in rec.events} == {"r1"}
    assert rec.of(RunStart)[0].nodes == 2
    assert rec.of(NodeStart)[0].step == 7
    assert all(e.seconds >= 0 for e in rec.of(NodeEnd)) and rec.of(RunEnd)[0].seconds >= 0
    assert rec.of(Metrics)[1].values == {"x": 2}
    rec.clear()
    g.run(1)
    assert kinds(rec.events) == [
        "RunStart",
        "NodeStart:inc",
        "NodeEnd:inc",
        "Metrics:inc",
        "CacheHit:inc_2",
        "RunEnd",
    ]
    assert rec.of(CacheHit)[0].run_id == g.run_id
    assert not rec.of(CacheMiss)


def test_events_are_frozen_and_watchers_match_by_shape() -> None:
    e = CacheHit("r", "n", "k" * 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.node = "m"  # type: ignore[misc]

    class Counts:  # no base class: a watcher by shape
        def __init__(self) -> None:
            self.n = 0

        def on_event(self, event: Event) -> str:
            self.n += 1
            return "ignored"  # nothing a watcher returns is used

    c = Counts()
    assert isinstance(c, Watcher) and isinstance(Recorder(), Watcher)
    assert Graph.somatize(Inc(), watchers=[c]).forward(1) == 2
    assert c.n == 5  # RunStart, NodeStart, NodeEnd, Metrics, RunEnd


def test_json_lines_writes_parseable_lines(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "run.jsonl"
    log = JsonLines(path)
    g = Graph.somatize(Inc() >> Inc(), watchers=[log]).cache("inc")
    g.run(1, run_id="abc")
    g.run(1, run_id="abc")
    log.close()
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is a JSON object
    assert records == JsonLines.read(path)
    names = [r["event"] for r in records]
    assert "NodeStart" not in names and "NodeEnd" not in names  # verbose events are opt-in
    assert names.count("RunStart") == 2 and names.count("CacheHit") == 1
    hit = next(r for r in records if r["event"] == "CacheHit")
    assert hit["node"] == "inc" and len(hit["key"]) == 64 and hit["run_id"] == "abc"
    assert all(isinstance(r["time"], float) for r in records)


def test_json_lines_verbose_and_unusual_values(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = JsonLines(path, nodes=True)

    class Odd(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            odd = {"nan": math.nan, "obj": object(), "n": 3, "nested": {"a": 1.5}}
            return Done(x, metrics={**odd, "pair": (0.1, [2, math.inf])})

    Graph.somatize(Odd(), watchers=[log]).forward(0)
    log.close()
    records = JsonLines.read(path)
    assert [r["event"] for r in records] == [
        "RunStart",
        "NodeStart",
        "NodeEnd",
        "Metrics",
        "RunEnd",
    ]
    values = records[3]["values"]
    assert values["nan"] == "nan" and values["n"] == 3 and values["nested"] == {"a": 1.5}
    assert values["obj"].startswith("<object object")
    assert values["pair"] == [0.1, [2, "inf"]]  # a tuple is an array (StepEnd.lrs), not its repr


def test_json_lines_appends_and_pickles_without_its_file(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    first = JsonLines(path)
    first.on_event(RunEnd("a", 1.0))
    copy = pickle.loads(pickle.dumps(first))  # as a process pool would ship it
    copy.on_event(RunEnd("b", 2.0))
    first.close()
    copy.close()
    assert [r["run_id"] for r in JsonLines.read(path)] == ["a", "b"]


def test_json_lines_given_no_path_says_what_to_give() -> None:
    with pytest.raises(TypeError, match=r"JsonLines takes the path .*, not 42; e\.g\. JsonLines\("):
        JsonLines(42)  # type: ignore[arg-type]
    gc.collect()  # __del__ of the half-made object must not raise (warnings are errors)


def test_json_lines_that_cannot_open_its_directory_fails_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError):
        JsonLines(blocker / "run.jsonl")
    gc.collect()  # __del__ of the half-made object must not raise (warnings are errors)


def test_a_torn_last_line_is_skipped_and_a_resumed_writer_starts_a_new_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    log = JsonLines(path)
    log.on_event(RunStart(run_id="r1", nodes=1))
    log.close()
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(whole[: len(whole) // 2])  # a writer killed mid-line: no newline
    assert [r["run_id"] for r in JsonLines.read(path)] == ["r1"]
    resumed = JsonLines(path)
    resumed.on_event(RunStart(run_id="r2", nodes=1))
    resumed.close()
    assert [r["run_id"] for r in JsonLines.read(path)] == ["r1", "r2"]  # not joined


def test_a_kill_at_any_byte_of_a_record_leaves_a_log_read_whole_before_and_after_a_resume(
    tmp_path: Path,
) -> None:
    """Found by an outside audit: a line cut right after a nested ``}`` ({"values":
    {"acc": 0.75}) passed for an altered line, and ``read`` raised on the log of a killed
    run. Every cut of the last record: the records before it, and after a resumed writer's
    line, that one too — never an error, never a record that was not written."""
    path = tmp_path / "run.jsonl"
    log = JsonLines(path)
    log.on_event(Metrics(run_id="r", node="enc", step=1, values={"acc": 0.5}))
    log.close()
    head = path.read_bytes()
    log = JsonLines(path)
    log.on_event(Metrics(run_id="r", node="enc", step=2, values={"acc": 0.75, "n": [1, 2]}))
    log.close()
    whole = path.read_bytes()
    first = JsonLines.read(path)[:1]
    for cut in range(len(head) + 1, len(whole) - 1):  # the last line, less its newline
        path.write_bytes(whole[:cut])
        assert JsonLines.read(path) == first, whole[len(head) : cut]
        resumed = JsonLines(path)
        resumed.on_event(RunEnd(run_id="r2", seconds=0.0))
        resumed.close()
        assert [r["event"] for r in JsonLines.read(path)] == ["Metrics", "RunEnd"]


def test_a_whole_line_that_is_not_json_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = JsonLines(path)
    log.on_event(RunStart(run_id="r1", nodes=1))
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"event": oops}\n')
    with pytest.raises(ValueError, match=r"run\.jsonl, line 2: not a JSON record"):
        JsonLines.read(path)


def test_a_short_write_is_an_error_and_the_next_line_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    path = tmp_path / "run.jsonl"
    log = JsonLines(path)
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:10]))  # disk full
    with pytest.raises(OSError, match=r"wrote 10 of the \d+ bytes of a line to .*run\.jsonl"):
        log.on_event(RunStart(run_id="r1", nodes=1))
    monkeypatch.setattr(os, "write", real)
    log.on_event(RunStart(run_id="r2", nodes=1))
    log.close()
    assert [r["run_id"] for r in JsonLines.read(path)] == ["r2"]
