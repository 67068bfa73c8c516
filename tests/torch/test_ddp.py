"""Data-parallel training under ``torchrun --nproc_per_node=2`` on CPU (gloo)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import ddp_train  # noqa: E402 -- the script the ranks run, imported for its model and data

from somatize import JsonLines, Recorder  # noqa: E402
from somatize.watchers import StepEnd  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out: Path, *args: str, nproc: int = 2, script: str = "ddp_train.py") -> int:
    """Run ``script`` (of tests/torch/scripts) under torchrun; once more on another port if
    another process took the one ``free_port`` found free (between its check and torchrun
    binding it)."""
    for _ in range(2):
        code, said = _torchrun_once(out, args, nproc, script)
        if code == 0 or b"EADDRINUSE" not in said:
            break
    return code


def _torchrun_once(out: Path, args: tuple[str, ...], nproc: int, script: str) -> tuple[int, bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",  # a rank that aborts prints every thread's Python stack
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(SCRIPTS / script), str(out), *args,
    ]  # fmt: skip
    path = out / "torchrun.log"
    start = path.stat().st_size if path.exists() else 0
    with path.open("ab") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                stop(proc)
    return code, path.read_bytes()[start:]


def said(out: Path) -> str:
    """The job's log for an assertion message: torchrun's failure summary first, then the
    ranks' own output, so that the end of a truncated CI log shows what a failed rank
    printed last (its error, or the stacks of one that aborted), not the summary."""
    text = (out / "torchrun.log").read_text()
    start = text.find("=" * 20)
    if start < 0:
        return text
    start = text.rfind("\n", 0, start) + 1
    end = text.rfind("=" * 20)
    end = text.find("\n", end) + 1 if text.find("\n", end) >= 0 else len(text)
    return "torchrun said:\n" + text[start:end] + "\nthe ranks said:\n" + text[:start] + text[end:]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a torchrun launcher and its workers. The workers run in sessions of their own,
    out of the launcher's process group: SIGTERM asks the launcher to stop them; whatever
    is left after is killed, the workers by pid."""
    workers = _children(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    assert torchrun(out) == 0, said(out)
    return out


@pytest.mark.slow
def test_torchrun_two_ranks_train_as_one_process_on_twice_the_batch(uninterrupted):
    tmp_path = uninterrupted
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["world"] == r1["world"] == 2

    # both ranks end with identical parameters, losses and (reduced) metrics
    assert r0["state"].keys() == r1["state"].keys()
    for name, value in r0["state"].items():
        assert torch.equal(value, r1["state"][name]), name
    assert r0["losses"] == r1["losses"] and len(r0["losses"]) == 8  # 8 batches / 2 ranks, 2 epochs
    assert r0["metrics"] == r1["metrics"]
    assert r0["num_examples"] == r1["num_examples"] == 32
    assert r0["val_examples"] == r1["val_examples"] == {"val_": 15}  # both ranks' val batches

    # only rank 0 checkpoints and logs; every rank knows the checkpoint
    assert (tmp_path / "saved-rank0").exists() and not (tmp_path / "saved-rank1").exists()
    assert r0["checkpoint"] == r1["checkpoint"] == str(tmp_path / "ckpt" / "step-000000008.ckpt")
    assert (tmp_path / "log-rank0.jsonl").exists() and not (tmp_path / "log-rank1.jsonl").exists()
    assert (tmp_path / "tb-rank0").exists() and not (tmp_path / "tb-rank1").exists()

    # the same as one process whose batches are the two ranks' batches together
    train, val = ddp_train.data()
    joined = [
        (torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]]))
        for a, b in zip(train[::2], train[1::2], strict=True)
    ]
    single = ddp_train.trainer(None, 0, micro_batches=1).fit(ddp_train.graph(), joined, val=val)
    torch.testing.assert_close(torch.tensor(r0["losses"]), torch.tensor(single.losses))
    for name, value in single.state.items():
        torch.testing.assert_close(r0["state"][name], value)
    # each epoch's node metric: over every rank's rows (each rank's micro-batches of 2),
    # as one process's over the batches joined
    assert r0["epoch_metrics"] == r1["epoch_metrics"] and len(r0["epoch_metrics"]["tanh/pos"]) == 2
    assert r0["epoch_metrics"]["tanh/pos"] == pytest.approx(
        single.epoch_metrics["tanh/pos"], rel=1e-6
    )
    # metrics are over the whole validation set: no rank dropped a batch
    for got, want in zip(r0["metrics"], single.metrics, strict=True):
        assert got["step"] == want["step"]
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5)
        assert got["val_acc"] == pytest.approx(want["val_acc"])


@pytest.mark.slow
def test_torchrun_resume_after_a_crash_equals_the_uninterrupted_run(uninterrupted, tmp_path):
    assert torchrun(tmp_path, "--crash-at", "7") != 0  # rank 0 fails; torchrun stops rank 1
    assert "crashing at step 7" in said(tmp_path)
    payload = torch.load(tmp_path / "ckpt" / "step-000000006.ckpt", weights_only=True)
    assert (payload["epoch"], payload["position"]) == (1, 2)  # mid-epoch
    assert torchrun(tmp_path, "--resume") == 0, said(tmp_path)
    want = torch.load(uninterrupted / "rank0.pt", weights_only=True)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["losses"] == want["losses"]
        assert got["metrics"] == want["metrics"]
        assert got["epoch_metrics"] == want["epoch_metrics"]  # every rank's sums resumed
        for name, value in want["state"].items():
            assert torch.equal(got["state"][name], value), name


@pytest.fixture(scope="module")
def loader_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-loader")
    assert torchrun(out, "--loader") == 0, said(out)
    return out


@pytest.mark.slow
def test_a_dataloader_is_sharded_each_rank_reads_only_its_share_and_rngs_are_per_rank(loader_run):
    r0 = torch.load(loader_run / "rank0.pt", weights_only=True)
    r1 = torch.load(loader_run / "rank1.pt", weights_only=True)
    assert len(r0["seen"]) == len(r1["seen"]) == 32  # 16 examples an epoch, 2 epochs
    for epoch in range(2):
        a, b = r0["seen"][16 * epoch : 16 * (epoch + 1)], r1["seen"][16 * epoch : 16 * (epoch + 1)]
        assert not set(a) & set(b) and set(a) | set(b) == set(range(32))
    assert r0["seen"][:16] != r0["seen"][16:]  # set_epoch: another permutation each epoch
    assert len(r0["losses"]) == 8 and r0["num_examples"] == 32
    for name, value in r0["state"].items():
        assert torch.equal(value, r1["state"][name]), name
    payload = torch.load(loader_run / "ckpt" / "step-000000008.ckpt", weights_only=True)
    assert len(payload["rngs"]) == 2  # every rank's RNG states
    assert not torch.equal(payload["rngs"][0]["torch"], payload["rngs"][1]["torch"])


@pytest.mark.slow
def test_a_sharded_dataloader_resumes_exactly_under_ddp(loader_run, tmp_path):
    assert torchrun(tmp_path, "--loader", "--crash-at", "5") != 0
    assert torchrun(tmp_path, "--loader", "--resume") == 0, said(tmp_path)
    want = torch.load(loader_run / "rank0.pt", weights_only=True)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["losses"] == want["losses"]
        assert got["metrics"] == want["metrics"]
        assert got["epoch_metrics"] == want["epoch_metrics"]  # every rank's sums resumed
        for name, value in want["state"].items():
            assert torch.equal(got["state"][name], value), name


@pytest.mark.slow
@pytest.mark.parametrize("clip", [None, 0.02], ids=["unclipped", "clip_grad_value"])
def test_accumulation_under_ddp_equals_one_process_on_the_groups_joined(tmp_path, clip):
    # 2 ranks x 2 accumulated batches of 4: one step is 16 examples, all-reduced once (and
    # clipped by value once, on the all-reduced gradient, as one process clips its own; the
    # gradient norm rank 0 tells, before the clamp, is the all-reduced one)
    flags = ("--accumulate",)
    if clip is not None:
        flags = (*flags, "--clip-value", str(clip), "--log-grad-norm")
    assert torchrun(tmp_path, *flags) == 0, said(tmp_path)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    assert len(r0["losses"]) == 4  # 8 batches / 2 ranks / 2 per step, 2 epochs
    train, val = ddp_train.data()
    joined = [
        (torch.cat([b[0] for b in train[i : i + 4]]), torch.cat([b[1] for b in train[i : i + 4]]))
        for i in range(0, 8, 4)
    ]
    recorder = Recorder()
    single = ddp_train.trainer(
        None, 0, micro_batches=1, clip_value=clip, log_grad_norm=True, extra=(recorder,)
    ).fit(ddp_train.graph(), joined, val=val)
    torch.testing.assert_close(torch.tensor(r0["losses"]), torch.tensor(single.losses))
    for name, value in single.state.items():
        torch.testing.assert_close(r0["state"][name], value)
    told = [
        r["grad_norm"]
        for r in JsonLines.read(tmp_path / "log-rank0.jsonl")
        if r["event"] == "StepEnd"
    ]
    if clip is None:
        assert told == [None] * 4  # not asked for: none told
    else:
        want = [e.grad_norm for e in recorder.of(StepEnd)]
        assert told == pytest.approx(want, rel=1e-5) and len(told) == 4
    if clip is not None:  # the clamp bit: one process unclipped ends elsewhere
        plain = ddp_train.trainer(None, 0, micro_batches=1).fit(ddp_train.graph(), joined, val=val)
        assert any(not torch.allclose(plain.state[k], v) for k, v in single.state.items())


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    import ddp_data

    out = tmp_path_factory.mktemp("ddp-data")
    ddp_data.one_process_checkpoints(out / "w1")  # read by the job's last fits
    assert torchrun(out, str(out / "w1"), script="ddp_data.py") == 0, said(out)
    return [torch.load(out / f"data-rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.slow
def test_a_loaders_own_sampler_is_sharded_not_replaced_each_rank_takes_its_share(data_run):
    import ddp_data
    from torch.utils.data import SubsetRandomSampler, WeightedRandomSampler

    from somatize.torch.samplers import epoch_generator

    def draw(name, epoch):  # the inner sampler's draw, as the Trainer seeds it
        gen = epoch_generator(0, epoch)
        if name == "subset":
            return list(SubsetRandomSampler(range(32), generator=gen))
        return list(WeightedRandomSampler(ddp_data.WEIGHTS, 32, generator=gen))

    for name in ("subset", "weighted"):
        r0, r1 = data_run[0][name], data_run[1][name]
        assert r0["steps"] == r1["steps"] == 8  # 32 rows / 2 ranks / 4 a batch, 2 epochs
        for epoch in range(2):
            a, b = (
                r0["rows"][16 * epoch : 16 * epoch + 16],
                r1["rows"][16 * epoch : 16 * epoch + 16],
            )
            assert a == draw(name, epoch)[0::2] and b == draw(name, epoch)[1::2], name
        assert max(r0["rows"] + r1["rows"]) < 32  # no held-out row read
        for key, value in r0["state"].items():
            assert torch.equal(value, r1["state"][key]), key
    # a batch sampler of one's own: every other batch of its 9, the ninth dropped
    order = [8, 0, 7, 1, 6, 2, 5, 3]
    for rank in (0, 1):
        got = data_run[rank]["batch_sampler"]
        assert got["steps"] == 4
        assert got["rows"] == [i for b in order[rank::2] for i in range(4 * b, 4 * b + 4)]
    # a sampler drawing differently on each rank is refused, by name, with the fix
    for rank in (0, 1):
        said = data_run[rank]["per_rank_error"]
        assert "PerRank drew a different sequence on each rank in epoch 0" in said
        assert "generator" in said and "DistributedSampler" in said


@pytest.mark.slow
def test_a_wrapped_sampler_resumes_exactly_under_ddp(data_run):
    for rank in (0, 1):
        (want_losses, want_state), (losses, state) = (
            data_run[rank]["resume"]["whole"],
            data_run[rank]["resume"]["resumed"],
        )
        assert losses == want_losses and len(losses) == 8
        for key, value in want_state.items():
            assert torch.equal(state[key], value), key


@pytest.mark.slow
def test_iterables_without_a_length_give_every_rank_as_many_steps(data_run):
    import ddp_data

    targets = [y.tolist() for _, y in ddp_data.batches(5)]
    for name in ("stream", "row_stream"):  # 5 batches: 2 rounds of 2, the fifth dropped
        for rank in (0, 1):
            got = data_run[rank][name]
            assert got["steps"] == 4, name  # 2 an epoch, 2 epochs
            assert got["targets"] == [targets[rank], targets[2 + rank]] * 2, name
    # rank 0 streams 3 batches, rank 1 five: they agree each round and stop together
    assert data_run[0]["uneven"]["steps"] == data_run[1]["uneven"]["steps"] == 2
    # num_examples (fedavg's weight) is one epoch over both ranks, not every epoch's: 2 rounds
    # of 2 ranks' batches of 8, whether the steps' non-finite check counted them or not
    for rank in (0, 1):
        assert data_run[rank]["stream"]["n"] == data_run[rank]["row_stream"]["n"] == 32
        assert data_run[rank]["stream_ignore"]["n"] == 32  # (3 epochs)
        assert data_run[rank]["uneven"]["n"] == 16  # 1 round an epoch: a batch of each rank


@pytest.mark.slow
def test_resuming_another_world_sizes_checkpoint_in_mid_epoch_is_refused(data_run):
    for rank in (0, 1):
        said = data_run[rank]["other_world_error"]
        assert "mid-epoch (epoch 0, batch 3 of its share) by a run of 1 process" in said
        assert "this run has 2" in said and "Resume in one process (without torchrun)" in said
        # one written at an epoch's end goes on: epoch 1 is 4 steps a rank
        assert data_run[rank]["other_world_epoch_end"] == {"steps": 12, "epochs": 2}


def test_what_runs_at_exit_collects_what_a_fit_that_raised_left_in_cycles(data_run):
    # its parameters (DDP's hooks on them), freed during the interpreter's teardown after
    # the group, aborted the job: "terminate called without an active exception"
    assert [data_run[rank]["exit_registered"] for rank in (0, 1)] == [True, True]
    assert [data_run[rank]["garbage_parameters"] for rank in (0, 1)] == [0, 0]


@pytest.mark.slow
def test_a_time_budget_stops_every_rank_at_the_same_step(tmp_path):
    # rank 1's (fake) clock runs twice as fast: its budget is spent after step 3
    assert torchrun(tmp_path, script="ddp_max_time.py") == 0, said(tmp_path)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["timed_out"] and r1["timed_out"] and r0["steps"] == r1["steps"] == 3
    assert [m["step"] for m in r0["metrics"]] == [3] and r0["metrics"] == r1["metrics"]
    for name, value in r0["state"].items():
        assert torch.equal(value, r1["state"][name]), name


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step_and_both_exit_143(tmp_path):
    # Options(stop_on="SIGTERM"): rank 1 alone gets it, during step 5 (of 20 a rank)
    assert torchrun(tmp_path, str(tmp_path), script="ddp_stop_on.py") != 0, said(tmp_path)
    ended = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert ended == ["5 143", "5 143"], said(tmp_path)  # (last step trained, SystemExit's code)
    written = sorted(p.name for p in (tmp_path / "ckpt").glob("step-*.ckpt"))
    assert written == ["step-000000005.ckpt"], said(tmp_path)
