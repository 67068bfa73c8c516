"""A recalled run says so: one INFO record on ``somatize.remember`` naming the call, the key
and ``.forget()``; on a terminal without logging set up, one line on stderr; nothing
printed elsewhere. ``forget`` makes the next call train again."""

import io
import logging

import pytest
import torch

import somatize.torch as st
from somatize import DiskKeeper, runs
from somatize.errors import KeeperError
from tests.torch.test_remember import data, train_one


@pytest.fixture
def keeper(tmp_path) -> DiskKeeper:
    return DiskKeeper(tmp_path / "runs")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_recall_logs_the_call_its_key_and_how_to_train_again(keeper, caplog):
    train = st.remember(train_one, keeper=keeper, exclude=("calls",))
    caplog.set_level(logging.INFO, logger="somatize.remember")
    first = train(3, data())
    assert not [r for r in caplog.records if r.name == "somatize.remember"]  # trained: silent
    again = train(3, data())
    assert again.recalled
    [record] = [r for r in caplog.records if r.name == "somatize.remember"]
    assert record.levelno == logging.INFO
    text = record.getMessage()
    assert text.startswith("train_one(seed=3, batches=") and again.key[:12] in text
    assert f"({first.steps} steps" in text and "nothing was trained now" in text
    assert ".forget()" in text and ".explain()" in text


def test_without_logging_a_terminal_gets_one_line_and_a_pipe_none(keeper, monkeypatch):
    train = st.remember(train_one, keeper=keeper)
    train(1, data())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # (pytest's capture handlers: logging unset)
    monkeypatch.setattr(logging.getLogger("somatize"), "handlers", [])
    monkeypatch.setattr(logging.getLogger("somatize.remember"), "handlers", [])
    piped = io.StringIO()
    monkeypatch.setattr("sys.stderr", piped)
    assert train(1, data()).recalled
    assert piped.getvalue() == ""  # a script's log, a CI job: nothing
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert train(1, data()).recalled
    lines = terminal.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("somatize: train_one(seed=1, ")
    assert "recalled the finished run" in lines[0] and ".forget()" in lines[0]


def test_forget_makes_the_next_call_train_and_says_whether_there_was_a_run(keeper):
    calls: list[int] = []
    train = st.remember(train_one, keeper=keeper, exclude=("calls",))
    first = train(2, data(), calls=calls)
    assert train(2, data(), calls=calls).recalled and calls == [2]
    assert train.forget(2, data(), calls=calls) is True
    assert not runs.RunStore(keeper.path / runs.FOLDER).dir(first.key).exists()
    retrained = train(2, data(), calls=calls)
    assert not retrained.recalled and calls == [2, 2]
    assert all(torch.equal(first.state[k], retrained.state[k]) for k in first.state)
    assert train(2, data(), calls=calls).recalled  # remembered again
    assert train.forget(5, data()) is False  # never run: nothing to forget


def test_forget_refuses_a_run_being_computed(keeper):
    train = st.remember(train_one, keeper=keeper, exclude=("calls",))
    store = runs.RunStore(keeper.path / runs.FOLDER)
    key = train.key(4, data())
    computing = pytest.raises(KeeperError, match=rf"run {key[:12]} is being computed now")
    with store.lock(key), computing:  # as a call computing it holds it
        train.forget(4, data())
    train.forget(4, data())  # released: the directory its lock made goes
    assert not store.dir(key).exists()
