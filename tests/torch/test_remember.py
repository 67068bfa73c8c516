"""st.remember: recall by key, a miss on each key part, honest errors, keeper failures, the CLI."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node, Opaque, runs
from somatize.cli import main
from somatize.errors import ValueConversionError
from somatize.watchers import StepEnd


class Linear(Node):
    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Crash(Exception):
    pass


class CrashAt:
    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_event(self, event) -> None:
        if isinstance(event, StepEnd) and event.step == self.step:
            raise Crash


def data(n: int = 4, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def train_one(
    seed: int,
    batches: list,
    epochs: int = 2,
    calls: list | None = None,
    crash_at: int | None = None,
):
    if calls is not None:
        calls.append(seed)
    torch.manual_seed(seed)
    g = Graph.somatize(Linear(4, 3))
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=epochs,
        metrics={"acc": st.accuracy},
        checkpoint=st.run_checkpointing(every_steps=2),
        watchers=[CrashAt(crash_at)],
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, batches, val=batches[:1], resume="last")


@pytest.fixture
def keeper(tmp_path) -> DiskKeeper:
    return DiskKeeper(tmp_path / "runs")


def remembered(keeper):
    return st.remember(train_one, keeper=keeper, exclude=("calls", "crash_at"))


def assert_same(a: st.TrainResult, b: st.TrainResult) -> None:
    assert a.state.keys() == b.state.keys()
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    assert (a.losses, a.metrics, a.steps, a.epochs, a.best) == (
        b.losses,
        b.metrics,
        b.steps,
        b.epochs,
        b.best,
    )


def test_a_second_call_recalls_every_field_without_running(keeper):
    train, calls = remembered(keeper), []
    first = train(0, data(), calls=calls)
    second = train(0, data(), calls=calls)
    assert calls == [0]  # the second call did not run
    assert not first.recalled and second.recalled and first.key == second.key
    assert isinstance(second, st.TrainResult) and "recalled" in repr(second)
    for f in dataclasses.fields(st.TrainResult):  # every field, generically: none dropped
        a, b = getattr(first, f.name), getattr(second, f.name)
        if f.name == "state":
            assert all(torch.equal(a[k], b[k]) for k in a)
        else:
            assert a == b, f.name
    plain = train_one(0, data())  # and what it recalls is what the function computes
    assert_same(second, plain)
    assert st.fedavg([first, second]).keys() == plain.state.keys()  # results feed level 3


def test_a_miss_on_each_argument_and_on_the_datasets_content(keeper):
    train, calls = remembered(keeper), []
    base = data()
    train(0, base, calls=calls)
    train(1, base, calls=calls)  # another seed
    train(0, base, epochs=3, calls=calls)  # another setting
    changed = data()
    changed[2][0][3, 1] += 1e-3  # one number of the dataset
    assert "argument 'batches' (list of 4" in train.explain(0, changed)
    train(0, changed, calls=calls)
    train(0, data(), calls=calls)  # equal content, other tensors: recalled
    assert calls == [0, 1, 0, 0]
    ds = TensorDataset(torch.arange(6.0))
    assert train.key(0, [ds]) == train.key(0, [TensorDataset(torch.arange(6.0))])
    assert train.key(0, [ds]) != train.key(0, [TensorDataset(torch.arange(6.0) + 1)])
    assert "differs in argument 'seed' (" in train.explain(5, base)  # 0 or 1 → 5: as near
    assert train.explain(0, base).startswith("recalled")


USER_CODE = '''
import torch
from torch import nn
import somatize.torch as st
from somatize import Graph, Node, Done, Opaque

class Linear(Node):
    def __init__(self, i, o):
        self.lin = nn.Linear(i, o)
    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))

def lr():
    return 1e-2  # HELPER

def train(seed, batches):
    """Train once."""  # DOC
    torch.manual_seed(seed)
    g = Graph.somatize(Linear(4, 3))
    trainer = st.Trainer(loss=nn.functional.cross_entropy,
                         optimizer=lambda ps: torch.optim.SGD(ps, lr=lr()), seed=seed,
                         options=st.Options(progress=False))
    return trainer.fit(g, batches)  # BODY
'''


def test_code_and_helper_changes_miss_comments_and_docstrings_do_not(keeper, user_module):
    def run(source: str):
        mod = user_module("remembered_user", source)
        return st.remember(mod.train, keeper=keeper), mod

    train, _ = run(USER_CODE)
    first = train(0, data())
    assert not first.recalled
    train, _ = run(USER_CODE.replace("# HELPER", "# the rate").replace("Train once.", "Once."))
    assert train(0, data()).recalled  # a comment, a docstring: the same run
    train, _ = run(USER_CODE.replace("return 1e-2", "return 2e-2"))
    assert "the helper 'lr' (its code)" in train.explain(0, data())
    assert not train(0, data()).recalled
    train, _ = run(
        USER_CODE.replace("return trainer.fit(g, batches)", "return trainer.fit(g, batches[:2])")
    )
    assert "the code of train" in train.explain(0, data())
    assert not train(0, data()).recalled
    train, _ = run(USER_CODE)  # back to the first code: its run is still there
    assert train(0, data()).recalled


def a_function():
    return 1


@dataclasses.dataclass(frozen=True)
class Config:
    lr: float
    layers: tuple[int, ...]


def takes(x, y=None, pool=None):
    return st.TrainResult(state={"w": torch.zeros(2)}, num_examples=1, steps=0, epochs=0)


@pytest.mark.parametrize(
    ("value", "what"),
    [
        (lambda: 1, "is a lambda"),
        (io.BytesIO(b"abc"), "is an open file"),
        ((i for i in range(3)), "(an iterator)"),
        (object(), "an object of type builtins.object"),
        ({1, 2}, "is a set"),
        (nn.Linear(2, 2), "is a Linear"),
        (torch.ones(2, requires_grad=True), "requires grad"),
    ],
)
def test_an_argument_that_cannot_be_keyed_is_named_with_the_fix(keeper, value, what):
    train = st.remember(takes, keeper=keeper)
    with pytest.raises(ValueConversionError) as e:
        train({"a": [1, value]})
    message = str(e.value)
    assert "argument 'x' of takes" in message and what in message
    assert "exclude=('x',)" in message


def test_keyable_arguments_and_exclusions(keeper):
    train = st.remember(takes, keeper=keeper, exclude=("pool",))
    k = train.key(Config(1e-3, (4, 4)), a_function, pool=object())  # excluded: not keyed
    assert k == train.key(Config(1e-3, (4, 4)), a_function, pool=object())
    assert k != train.key(Config(1e-3, (4, 8)), a_function)
    assert k != train.key(Config(1e-3, (4, 4)), takes)
    state = {"w": torch.ones(2)}
    assert train.key(state) == train.key(
        st.fedavg([state, state], weights="uniform")
    )  # a dict subclass: by content
    with pytest.raises(ValueError, match=r"exclude names 'nope'.*its arguments: x, y, pool"):
        st.remember(takes, keeper=keeper, exclude=("nope",))
    with pytest.raises(ValueError, match="pass dir="):
        st.remember(takes, keeper=MemoryKeeper())
    with pytest.warns(RuntimeWarning, match="not a TrainResult"):
        assert st.remember(a_function, keeper=keeper)() == 1
    # found by an outside audit: its record stayed "started", read as a run killed
    (record,) = [
        r
        for r in runs.RunStore(keeper.path / runs.FOLDER).records()
        if "a_function" in r["function"]
    ]
    assert record["status"] == "unremembered" and "not a TrainResult" in record["error"]


def returns_odd(kind):
    seed = object() if kind == "object" else 1  # (a field holding what is not data)
    return st.TrainResult(
        state={"w": torch.arange(3.0)},
        num_examples=3,
        steps=1,
        epochs=1,
        checkpoint=Path("a/b"),
        seed=seed,
    )


def test_a_result_that_cannot_be_written_down_is_returned_with_a_warning(keeper):
    train = st.remember(returns_odd, keeper=keeper)
    assert not train("path").recalled
    recalled = train("path")
    assert recalled.recalled and torch.equal(recalled.state["w"], torch.arange(3.0))
    assert recalled.checkpoint == "a/b"  # a path comes back as a str
    with pytest.warns(
        RuntimeWarning,
        match=r"field 'seed' of the TrainResult holds a value of type object.*not remembered",
    ):
        assert train("object").seed is not None
    with pytest.warns(RuntimeWarning):
        assert not train("object").recalled


def test_a_run_that_raised_is_not_remembered_and_resumes_from_its_checkpoint(keeper):
    train, calls = remembered(keeper), []
    with pytest.raises(Crash):
        train(0, data(), epochs=3, calls=calls, crash_at=7)
    key = train.key(0, data(), epochs=3)
    record = runs.RunStore(keeper.path / runs.FOLDER).record(key)
    assert record["status"] == "failed" and "Crash" in record["error"]
    assert st.Checkpointing(keeper.path / runs.FOLDER / key / "ckpt").last().name.endswith("6.ckpt")
    assert "it raised: Crash" in train.explain(0, data(), epochs=3)
    resumed = train(0, data(), epochs=3, calls=calls)
    assert not resumed.recalled and calls == [0, 0]
    assert_same(resumed, train_one(0, data(), epochs=3))  # bitwise the uninterrupted run
    assert train(0, data(), epochs=3, calls=calls).recalled


def test_a_keeper_on_a_full_disk_warns_naming_the_path_and_returns_the_result(keeper, monkeypatch):
    import os
    import re

    real, objects = os.replace, str(keeper.path / "objects")

    def full(src, dst):  # the keeper's disk is full; the checkpoints' (elsewhere) is not
        if str(dst).startswith(objects):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", full)
    train, calls = remembered(keeper), []
    path = re.escape(str(keeper.path))
    with pytest.warns(
        RuntimeWarning, match=rf"KeeperError: could not write cache entry .*{path}.*No space left"
    ):
        result = train(0, data(), calls=calls)
    assert_same(result, train_one(0, data()))
    monkeypatch.undo()
    again = train(0, data(), calls=calls)  # not remembered: computed again (from its checkpoint)
    assert not again.recalled and calls == [0, 0]
    assert_same(again, result)


def test_a_read_only_run_directory_warns_and_checkpoints_elsewhere(keeper, monkeypatch):
    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(runs, "atomic_write", read_only)
    train = remembered(keeper)
    with pytest.warns(
        RuntimeWarning, match=r"KeeperError: could not write the run record .*run\.json"
    ):
        result = train(0, data())
    assert not result.recalled and result.checkpoint is not None
    assert str(keeper.path) not in result.checkpoint  # a temporary directory
    assert_same(result, train_one(0, data()))


def test_runs_ls_show_gc_from_the_command_line(keeper, capsys, tmp_path):
    train = remembered(keeper)
    first = train(0, data())
    train(1, data(n=2))
    with pytest.raises(Crash):
        train(2, data(), crash_at=3)
    assert main(["runs", "ls", "--dir", str(keeper.path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[-1].startswith("3 runs (2 finished), ")
    line = next(x for x in out if x.startswith(first.key[:12]))
    assert "train_one(seed=0, batches=list of 4, epochs=2)" in line
    assert f"loss={first.losses[-1]:.4g}" in line and "val_acc=" in line and " kB" in line
    assert any(x.endswith("failed") for x in out)

    assert main(["runs", "show", first.key[:10], "--dir", str(keeper.path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["key"] == first.key and shown["status"] == "done"
    assert shown["function"].endswith("train_one") and set(shown["args"]) == {
        "seed",
        "batches",
        "epochs",
    }
    assert main(["runs", "show", "zz", "--dir", str(keeper.path)]) == 2
    assert main(["runs", "gc", "--dir", str(keeper.path)]) == 2
    capsys.readouterr()

    # the command runs without torch
    script = tmp_path / "no_torch.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            sys.modules["torch"] = None
            from somatize.cli import main
            sys.exit(main(["runs", "ls", "--dir", sys.argv[1]]))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script), str(keeper.path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("3 runs (2 finished)")

    size = sum(r["size"] for r in runs.RunStore(keeper.path / runs.FOLDER).records())
    assert main(["runs", "gc", "--older-than", "1h", "--dir", str(keeper.path)]) == 0
    assert capsys.readouterr().out.startswith("removed 0 runs; 3 left")
    assert train(0, data()).recalled
    assert main(["runs", "gc", "--max-bytes", str(size - 1), "--dir", str(keeper.path)]) == 0
    out = capsys.readouterr().out
    assert out.count("removed ") == 2 and "removed 1 run; 2 left" in out  # the least recently used
    assert main(["runs", "gc", "--older-than", "0s", "--dir", str(keeper.path)]) == 0
    assert "removed 2 runs; 0 left" in capsys.readouterr().out
    assert not list(keeper.keys())  # their results left the keeper too
    calls: list = []
    assert not train(0, data(), calls=calls).recalled and calls == [0]


def test_runs_remembered_in_a_dir_of_their_own_are_seen_by_the_command_line(tmp_path, capsys):
    keeper, mine = DiskKeeper(tmp_path / "K"), tmp_path / "myruns"
    train = st.remember(train_one, keeper=keeper, exclude=("calls", "crash_at"), dir=mine)
    first = train(0, data())
    assert main(["runs", "ls", "--dir", str(mine)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(first.key[:12]) and out[-1].startswith("1 run (1 finished)")
    assert (
        main(["runs", "gc", "--older-than", "0s", "--dir", str(mine), "--keeper", str(keeper.path)])
        == 0
    )
    assert "removed 1 run; 0 left" in capsys.readouterr().out
    assert not list(keeper.keys()) and not train(0, data()).recalled


def test_a_short_tuple_argument_is_listed_item_by_item():
    """A federated client's task (tensors, a client id, a round) shows what it holds in
    ``runs ls``; a batch list, or anything long, stays counted."""
    from somatize.runkey import summarize_value

    task = (torch.zeros(64, 4), torch.zeros(64, dtype=torch.long), 1003, 0.5, 7)
    assert summarize_value(task) == "(Tensor float32 [64, 4], Tensor int64 [64], 1003, 0.5, 7)"
    assert (
        summarize_value({"lr": 0.1, "w": torch.zeros(3)}) == "{'lr': 0.1, 'w': Tensor float32 [3]}"
    )
    assert summarize_value((torch.zeros(3),)) == "(Tensor float32 [3],)"
    assert summarize_value([(torch.zeros(2), 1)] * 4) == "list of 4"  # (a list of batches)
    assert summarize_value(tuple(range(9))) == "tuple of 9"
    assert summarize_value(("x" * 50, "y" * 50)) == "tuple of 2"  # (too long to list)
