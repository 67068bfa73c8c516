"""Resuming: bitwise identical to an uninterrupted run — after a crash, mid-epoch, or a SIGKILL."""

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
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import CheckpointError
from somatize.watchers import StepEnd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "resumable.py"


class Body(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 12)
        self.drop = nn.Dropout(0.25)

    def forward(self, x, ctx):
        return Done(Opaque(self.drop(torch.relu(self.lin(x)))))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(12, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def graph(init_seed: int) -> Graph:
    torch.manual_seed(
        init_seed
    )  # a resumed run starts from other weights: resume must replace them
    return Graph.somatize(Body() >> Head())


def data(n: int = 5):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(6, 4, generator=gen), torch.randint(0, 3, (6,), generator=gen))
        for _ in range(n)
    ]


class Crash(Exception):
    pass


class CrashAt:
    """Raises at the end of one step, like a process dying there."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_event(self, event) -> None:
        if isinstance(event, StepEnd) and event.step == self.step:
            raise Crash


def trainer(tmp_path, watchers=(), pruner="patience", **options) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=2e-2),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
        epochs=4,
        metrics={"acc": st.accuracy},
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=3, keep=2),
        watchers=watchers,
        # "max" on a falling loss: patience runs out at the 3rd evaluation (step 12)
        pruner=st.Patience("val_loss", patience=2, mode="max") if pruner == "patience" else None,
        seed=5,
        options=st.Options(progress=False, eval_every_steps=4, **options),
    )


def assert_same(a: st.TrainResult, b: st.TrainResult) -> None:
    assert a.losses == b.losses
    assert a.metrics == b.metrics
    assert (a.steps, a.epochs, a.pruned, a.best) == (b.steps, b.epochs, b.pruned, b.best)
    assert a.state.keys() == b.state.keys()
    for name, value in a.state.items():
        assert torch.equal(value, b.state[name]), name


@pytest.mark.parametrize(
    ("crash_at", "last_step", "position"), [(7, 6, 1), (10, 9, 4), (11, 10, 0)]
)
def test_resume_after_a_crash_mid_epoch_is_bitwise_identical(
    tmp_path, crash_at, last_step, position
):
    reference = trainer(tmp_path / "ref").fit(graph(0), data(), val=data(2))
    assert reference.pruned and reference.steps == 12  # the pruner's state matters after resume

    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(crash_at)]).fit(graph(0), data(), val=data(2))
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert (last["step"], last["position"]) == (last_step, position)  # 5 batches an epoch
    resumed = trainer(tmp_path).fit(graph(99), data(), val=data(2), resume="last")
    assert_same(resumed, reference)


def test_resume_from_an_explicit_path_and_from_a_finished_run(tmp_path):
    reference = trainer(tmp_path / "ref", pruner=None).fit(graph(0), data(), val=data(2))
    assert reference.steps == 20
    path = next(
        p for p in sorted((tmp_path / "ref" / "ckpt").iterdir()) if p.name.startswith("step")
    )
    step = st.load_checkpoint(path)["step"]
    assert 0 < step < 20
    again = trainer(tmp_path / "ref", pruner=None).fit(graph(1), data(), val=data(2), resume=path)
    assert_same(again, reference)
    done = trainer(tmp_path / "ref", pruner=None).fit(graph(2), data(), val=data(2), resume="last")
    assert_same(done, reference)  # nothing left to train: the finished run's result


def test_resume_with_a_dataloader_and_dropout_is_bitwise_identical(tmp_path):
    def loader():
        gen = torch.Generator().manual_seed(0)
        x, y = torch.randn(40, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen)
        return DataLoader(TensorDataset(x, y), batch_size=6, shuffle=True)

    reference = trainer(tmp_path / "ref", pruner=None).fit(graph(0), loader())
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(11)], pruner=None).fit(graph(0), loader())
    resumed = trainer(tmp_path, pruner=None).fit(graph(3), loader(), resume="last")
    assert_same(resumed, reference)


def test_resume_last_without_a_checkpoint_is_a_fresh_start(tmp_path):
    fresh = trainer(tmp_path / "a").fit(graph(0), data(), val=data(2))
    assert st.Checkpointing(tmp_path / "b" / "ckpt").last() is None
    started = trainer(tmp_path / "b").fit(graph(0), data(), val=data(2), resume="last")
    assert_same(started, fresh)


def test_a_fresh_fit_will_not_mix_with_an_earlier_runs_checkpoints(tmp_path):
    trainer(tmp_path).fit(graph(0), data(), val=data(2))
    with pytest.raises(CheckpointError, match=r"earlier run.*resume='last'"):
        trainer(tmp_path).fit(graph(0), data(), val=data(2))


def test_resuming_with_another_seed_is_refused(tmp_path):
    trainer(tmp_path).fit(graph(0), data(), val=data(2))
    other = trainer(tmp_path)
    other.seed = 6
    with pytest.raises(CheckpointError, match=r"seed=5.*seed=6"):
        other.fit(graph(0), data(), val=data(2), resume="last")


def test_resuming_another_model_is_refused(tmp_path):
    trainer(tmp_path).fit(graph(0), data(), val=data(2))
    torch.manual_seed(0)
    other = Graph.somatize(Body() >> Body())
    with pytest.raises(
        CheckpointError, match=r"resuming from .*step-\d{9}\.ckpt: the checkpoint does not fit"
    ):  # the file resume="last" picked, named
        trainer(tmp_path).fit(other, data(), val=data(2), resume="last")


def test_resuming_into_a_graph_frozen_otherwise_names_the_node_and_the_freeze_call(tmp_path):
    first = trainer(tmp_path)
    first.fit(graph(0).freeze("body"), data(), val=data(2))
    assert first.checkpoint is not None
    assert st.load_checkpoint(first.checkpoint.last())["frozen"] == {"": ["body"]}
    # (before: "does not fit this model or optimizer (loaded state dict contains a parameter
    # group that doesn't match the size of optimizer's group)", naming no node)
    with pytest.raises(CheckpointError, match=r"node 'body' frozen, which this graph trains") as e:
        trainer(tmp_path).fit(graph(0), data(), val=data(2), resume="last")
    assert "(g.freeze('body')) before resuming" in str(e.value)
    with pytest.raises(CheckpointError, match="and node 'head' trainable, which this graph fr"):
        trainer(tmp_path).fit(graph(0).freeze("head"), data(), val=data(2), resume="last")


@pytest.mark.parametrize("kept", ["world", "rngs"])  # a checkpoint from before "world" was kept
def test_resuming_in_mid_epoch_a_checkpoint_of_another_world_size_is_refused(tmp_path, kept):
    from somatize.torch import integrity

    with pytest.raises(Crash):  # checkpoints at step 3 (batch 3 of 5) and 5 (the epoch's end)
        trainer(tmp_path, watchers=[CrashAt(6)], pruner=None).fit(graph(0), data(), val=data(2))
    ckpt = tmp_path / "ckpt"
    for step in (3, 5):  # as if 2 ranks had written them
        path = ckpt / f"step-{step:09d}.ckpt"
        payload = st.load_checkpoint(path)
        assert payload["world"] == 1
        if kept == "rngs":
            del payload["world"]
            payload["rngs"] = [payload["rng"]] * 2
        else:
            payload["world"] = 2
        integrity.write_checkpoint(path, payload)
    mid = ckpt / "step-000000003.ckpt"
    with pytest.raises(
        CheckpointError,
        match=r"mid-epoch \(epoch 0, batch 3 of its share\) by"
        r" a run of 2 processes; this run has 1.*torchrun --nproc_per_node=2",
    ):
        trainer(tmp_path, pruner=None).fit(graph(0), data(), val=data(2), resume=mid)
    done = trainer(tmp_path, pruner=None)
    done.max_steps, done.checkpoint = 3, None  # stopped at the mid-epoch checkpoint: done
    assert done.fit(graph(0), data(), val=data(2), resume=mid).steps == 3
    end = trainer(tmp_path, pruner=None).fit(
        graph(0), data(), val=data(2), resume=ckpt / "step-000000005.ckpt"
    )
    assert end.steps == 20  # an epoch's end resumes on any number of processes


def test_one_trainer_runs_many_fits_each_from_the_pruners_start(tmp_path):
    t = trainer(tmp_path, pruner="patience")
    t.checkpoint = None
    first = t.fit(graph(0), data(), val=data(2))
    second = t.fit(graph(0), data(), val=data(2))
    assert_same(first, second)  # the Patience counter did not carry over


# -- SIGKILL at random moments ----------------------------------------------------------


class Trainings:
    """The training script's server: one subprocess that forks each training run.

    Each run is its own process, killed by a real SIGKILL; only importing torch is shared.
    """

    def __init__(self, stderr: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.stderr = stderr
        with stderr.open("wb") as err:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-u", str(SCRIPT), "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,  # its own process group: stop() ends the forked runs too
            )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.buf = b""
        assert self.line() == "ready"

    def line(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                raise AssertionError(
                    f"the training subprocess said nothing for two minutes (unread: {self.buf!r}):\n"
                    + self.stderr.read_text()
                )
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                code = self.proc.wait(timeout=60)
                raise AssertionError(
                    f"the training subprocess ended (exit code {code}):\n" + self.stderr.read_text()
                )
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def send(self, text: str) -> None:
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def run(
        self, ckpt: Path, out: Path, kill_at: tuple[str, int] | None, rng: random.Random
    ) -> int:
        """One training run, killed at the ``kill_at[1]``-th line starting with ``kill_at[0]``
        (or run to its end); returns its exit code (-9 when killed)."""
        self.send(f"{ckpt} {out} --hooks")
        pid = int(self.line().removeprefix("pid "))
        seen, killed = 0, False
        while not (line := self.line()).startswith("exit "):
            if killed:  # lines it wrote before dying: answer none (the server would read them)
                continue
            if kill_at is not None and line.startswith(kill_at[0]):
                seen += 1
                if seen == kill_at[1]:
                    if line.startswith("step"):
                        time.sleep(
                            rng.uniform(0, 0.02)
                        )  # let it run on a random while: land anywhere
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                    continue
            if line.startswith("hook"):
                self.send("")
        return int(line.removeprefix("exit "))

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


@pytest.fixture
def trainings(tmp_path):
    server = Trainings(tmp_path / "stderr.txt")
    try:
        yield server
    finally:
        server.stop()


def check_checkpoints(ckpt: Path) -> int:
    """Every checkpoint file and ``last`` load; returns the step ``last`` names (0 if none)."""
    if not ckpt.exists():
        return 0
    for f in ckpt.iterdir():
        if f.name.startswith("step-"):
            st.load_checkpoint(f)
    last = st.Checkpointing(ckpt).last()
    return 0 if last is None else st.load_checkpoint(last)["step"]


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_run(tmp_path, trainings):
    rng = random.Random(20240611)
    assert trainings.run(tmp_path / "ref", tmp_path / "ref.pt", None, rng) == 0
    reference = torch.load(tmp_path / "ref.pt", weights_only=True)
    assert len(reference["losses"]) == 24

    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    # where to kill: the n-th such line of a run, n drawn from a range that lets a run
    # first complete a checkpoint or two (each checkpoint: 4 fsyncs, 2 replaces; one
    # every 2 steps, the epoch's end's included), so that 5 kills come before the end
    kinds = [
        ("hook fsync", 3, 6),  # mid-write: a temp file written, not synced or renamed
        ("hook replace step-", 2, 3),  # a checkpoint complete, its rename not done
        ("hook replace last", 2, 3),  # the checkpoint in place, last naming the previous one
        ("step", 3, 5),  # anywhere: mid-step, mid-evaluation, mid-torch.save
        ("step", 3, 5),
        ("hook fsync", 3, 6),
    ]
    rng.shuffle(kinds)
    codes, lasts, torn = [], [], []
    for prefix, low, high in kinds:
        codes.append(trainings.run(ckpt, out, (prefix, rng.randint(low, high)), rng))
        lasts.append(check_checkpoints(ckpt))  # every kill leaves loadable checkpoints
        torn.append(sorted(f.name for f in ckpt.glob(".*.tmp")))  # a write cut short
        if codes[-1] == 0:
            break
    assert codes.count(-signal.SIGKILL) >= 5, codes
    assert set(codes) <= {0, -signal.SIGKILL}
    assert lasts == sorted(lasts) and len(set(lasts)) >= 4, lasts  # progress, never lost
    assert sum(map(bool, torn)) >= 2, torn  # some kills did land inside a checkpoint write
    while trainings.run(ckpt, out, None, rng) != 0:
        pass
    assert not list(ckpt.glob(".*.tmp"))  # the finished run cleared what the killed ones left
    resumed = torch.load(out, weights_only=True)
    assert resumed["losses"] == reference["losses"]
    assert resumed["metrics"] == reference["metrics"]
    for name, value in reference["state"].items():
        assert torch.equal(resumed["state"][name], value), name
