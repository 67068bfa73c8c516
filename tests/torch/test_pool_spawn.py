"""TorchPool as on macOS and Windows: workers started by ``spawn``, which import the user's
``__main__`` again (a script) or get its functions and classes by value (a notebook)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from somatize.torch.pool import TorchPool
from somatize.torch.pool_worker import worker_count

# classes and functions of __main__, as a script or a notebook defines them
PROGRAM = """
import torch
import somatize.torch as st

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)

class Score:
    def __init__(self, value):
        self.value = value

def train(seed):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    return Score(float(Net().fc.weight.detach().sum()))

def main():
    with st.executor(2, start_method="spawn") as pool:
        got = [s.value for s in pool.map(train, range(3))]
    torch.set_num_threads(1)
    want = [train(seed).value for seed in range(3)]
    assert got == want, (got, want)
    print("OK", pool.start_method)
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # (a Python with torch started per worker)
def test_a_script_with_the_main_guard_runs_its_own_classes_under_spawn(tmp_path: Path) -> None:
    script = tmp_path / "campaign.py"
    script.write_text(PROGRAM + '\nif __name__ == "__main__":\n    main()\n')
    done = _run([str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["OK", "spawn"]


@pytest.mark.slow
def test_a_notebooks_classes_travel_by_value_under_spawn(tmp_path: Path) -> None:
    # `python -c`: a __main__ without a file, as in Jupyter — nothing to import again
    done = _run(["-c", PROGRAM + "\nmain()\n"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["OK", "spawn"]


@pytest.mark.slow
def test_a_script_without_the_main_guard_is_told_so_at_once(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(PROGRAM + "\nmain()\n")
    done = _run([str(script)], tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("somatize.errors.WorkerLostError: call 0, train(0), was lost: no ")
    assert str(script) in last and 'if __name__ == "__main__":' in last
    assert "'spawn'" in last
    # each worker says so too, and the pool is not started six times over
    assert done.stderr.count("a pool was made while a worker process imported") >= 1
    assert done.stderr.count("WorkerLostError") == 1


def test_no_pool_is_made_while_a_worker_imports_the_main_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match=r'under `if __name__ == "__main__":`'):
        TorchPool(1)


def test_windows_caps_the_workers_at_61(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 128)
    assert worker_count(None) == 128  # Linux: one per CPU
    monkeypatch.setattr(sys, "platform", "win32")
    assert (worker_count(None), worker_count(61), worker_count(3)) == (61, 61, 3)
    with pytest.raises(ValueError, match=r"workers=62\): Windows runs at most 61"):
        worker_count(62)


def test_the_guard_message_names_what_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    from somatize.torch import pool_worker

    text = pool_worker.start_failed("fork")
    assert "__main__" not in text  # a forked worker imports nothing again
    monkeypatch.setattr(pool_worker, "_main_file", lambda name="__main__": None)
    assert "__main__" not in pool_worker.start_failed("spawn")  # a notebook has no file
