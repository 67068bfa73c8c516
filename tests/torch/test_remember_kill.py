"""Remembered runs SIGKILLed at random instants, raced by two processes, and a federated loop
killed mid-round: reruns resume, nothing is torn, every result is bitwise the uninterrupted one."""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import somatize.torch as st
from somatize import DiskKeeper, runs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "remembered.py"


class Server:
    """The script's fork server: each command runs in its own forked process."""

    def __init__(self, stderr: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.stderr = stderr
        with stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", str(SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,  # its own process group: stop() ends the children too
            )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.buf = b""
        self.pending: list[str] = []
        assert self.line() == "ready"

    def line(self, timeout: float = 120.0) -> str:
        if self.pending:
            return self.pending.pop(0)
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                raise AssertionError(
                    f"the script said nothing for two minutes (unread: {self.buf!r}):\n"
                    + self.log()
                )
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError("the script ended:\n" + self.log())
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def log(self) -> str:
        return self.stderr.read_text()[-4000:]

    def until(self, pid: int, *want: str, count: int = 1) -> list[str]:
        """Lines of child ``pid`` up to the ``count``-th starting with one of ``want``, or its
        last line (``computed``, ``recalled``); other children's lines are kept."""
        seen, others = [], []
        while True:
            line = self.line()
            head, _, text = line.partition(" ")
            if head != str(pid):
                others.append(line)
                continue
            seen.append(text)
            count -= text.startswith(want)
            if count == 0 or text in ("computed", "recalled"):
                self.pending = others + self.pending
                return seen

    def start(self, *words: object) -> int:
        self.send(" ".join(map(str, words)))
        head, _, text = self.line().partition(" ")
        assert text == "pid", (head, text, self.log())
        return int(head)

    def wait(self, pid: int) -> int:
        self.send(f"wait {pid}")
        while True:
            line = self.line()
            if line.startswith(f"exit {pid} "):
                return int(line.split()[2])

    def send(self, text: str) -> None:
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=60)
            self.proc.stdout.close()
            self.sel.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("server") / "stderr.txt")  # one torch import for all
    try:
        yield s
    finally:
        s.stop()


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def finish(server: Server, keeper: Path, out: Path) -> int:
    pid = server.start("run", keeper, out)
    return server.wait(pid)


def check_not_torn(keeper: Path) -> str:
    """Each kill leaves a run that is recorded whole or not at all: its status, and every
    checkpoint loadable."""
    records = runs.RunStore(keeper / runs.FOLDER).records()
    assert len(records) <= 1
    if not records:
        return "none"
    record = records[0]
    ckpt = keeper / runs.FOLDER / record["key"] / "ckpt"
    for f in ckpt.glob("step-*.ckpt") if ckpt.exists() else ():
        st.load_checkpoint(f)
    if record.get("status") == "done":  # the result is complete in the keeper
        assert DiskKeeper(keeper).get(record["key"]) is not None
    return str(record.get("status"))


@pytest.mark.slow
def test_sigkill_at_random_instants_then_rerun_resumes_bitwise(tmp_path, server):
    rng = random.Random(1406)
    assert finish(server, tmp_path / "ref", tmp_path / "ref.pt") == 0
    reference = load(tmp_path / "ref.pt")
    assert not reference["recalled"] and len(reference["losses"]) == 24

    def finished(keeper: Path, out: Path) -> None:
        """Run ``keeper``'s run to its end: bitwise the reference; then it is recalled."""
        assert finish(server, keeper, out) == 0
        result = load(out)
        assert same_state(result["state"], reference["state"])
        assert result["losses"] == reference["losses"]
        assert result["key"] == reference["key"]
        assert finish(server, keeper, out) == 0
        assert load(out)["recalled"]

    # campaigns killed three times each (a kill may come too late: the run had ended), then
    # finished, until at least twelve kills have landed
    kills, statuses, trial, here = 0, [], 0, 0
    for _ in range(60):
        keeper, out = tmp_path / f"k{trial}", tmp_path / f"out{trial}.pt"
        pid = server.start("run", keeper, out)
        if rng.random() < 0.25:
            server.until(pid, "fit done")  # land in encoding, storing, recording
            time.sleep(rng.uniform(0, 0.003))
        else:
            server.until(pid, "step", count=rng.randint(1, 8))
            time.sleep(rng.uniform(0, 0.02))  # anywhere: mid-step, mid-checkpoint
        os.kill(pid, signal.SIGKILL)
        landed = server.wait(pid) == -signal.SIGKILL
        statuses.append(check_not_torn(keeper))
        kills, here = kills + landed, here + landed
        if here == 3 or not landed:
            finished(keeper, out)
            trial, here = trial + 1, 0
        if kills >= 12:
            break
    if here:
        finished(keeper, out)
    assert kills >= 10, kills
    assert "started" in statuses  # some kills landed mid-run


@pytest.mark.slow
def test_two_processes_on_one_key_one_computes_the_other_waits_and_recalls(tmp_path, server):
    keeper = tmp_path / "k"
    first = server.start("run", keeper, tmp_path / "a.pt", "--hold")
    server.until(first, "computing")  # it holds the lock
    second = server.start("run", keeper, tmp_path / "b.pt", "--hold")
    server.until(second, "flock")  # it missed and asks for the lock the first one holds
    os.kill(first, signal.SIGUSR1)
    assert server.wait(first) == 0 and server.wait(second) == 0
    a, b = load(tmp_path / "a.pt"), load(tmp_path / "b.pt")
    assert not a["recalled"] and b["recalled"]  # (had it computed too, it would wait forever)
    assert same_state(a["state"], b["state"]) and a["losses"] == b["losses"]
    assert [r["status"] for r in runs.RunStore(keeper / runs.FOLDER).records()] == ["done"]


@pytest.mark.slow
def test_a_federated_loop_killed_mid_round_recalls_the_finished_rounds(tmp_path, server):
    plain = server.start("fed", tmp_path / "unused", tmp_path / "ref.pt", "--plain")
    assert server.wait(plain) == 0
    reference = load(tmp_path / "ref.pt")["state"]

    keeper, out = tmp_path / "k", tmp_path / "out.pt"
    pid = server.start("fed", keeper, out, "--stop-at=round_2_client_1_step_3")
    server.until(pid, "round 2 client 1 step 3")  # rounds 0, 1 and client 0 of round 2 done
    os.kill(pid, signal.SIGKILL)
    assert server.wait(pid) == -signal.SIGKILL
    again = server.start("fed", keeper, out)
    lines = server.until(again, "round")  # the first step it computes is the killed client's
    assert lines[-1].startswith("round 2 client 1 step "), lines
    assert int(lines[-1].split()[-1]) >= 3  # resumed from its checkpoint, not from step 1
    assert server.wait(again) == 0
    result = load(out)
    assert result["recalled"] == 2 * 3 + 1  # rounds 0 and 1, and round 2's first client
    assert same_state(result["state"], reference)
