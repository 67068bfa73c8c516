"""Jobs under torchrun: one process group for a sweep of fits, and remembered fits."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from tests.torch.test_ddp import ddp_train, said, torchrun


@pytest.mark.slow
def test_a_sweep_of_fits_in_one_torchrun_job_uses_one_group_and_equals_the_joined_batches(
    tmp_path,
):
    import ddp_sweep  # (of scripts/, which test_ddp puts on the path)

    # Destroying the group after each fit and making another hung gloo's rendezvous in
    # about one job in two; one group, kept, serves every fit and the evaluation after.
    assert torchrun(tmp_path, script="ddp_sweep.py") == 0, said(tmp_path)
    r0, r1 = (torch.load(tmp_path / f"sweep-rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["one_group"] and r1["one_group"]
    train, val = ddp_train.data()
    joined = [  # 2 ranks × batches of 4: each step is two consecutive batches joined
        (torch.cat([train[i][0], train[i + 1][0]]), torch.cat([train[i][1], train[i + 1][1]]))
        for i in range(0, 8, 2)
    ]
    for lr, f0, f1 in zip(ddp_sweep.LRS, r0["fits"], r1["fits"]):
        single = ddp_sweep.sweep_trainer(lr).fit(ddp_train.graph(), joined, val=val)
        assert f0["losses"] == f1["losses"]
        torch.testing.assert_close(torch.tensor(f0["losses"]), torch.tensor(single.losses))
        for name, value in single.state.items():
            torch.testing.assert_close(f0["state"][name], value)
            torch.testing.assert_close(f1["state"][name], value)
    assert r0["evaluated"] == r1["evaluated"]  # sharded over the kept group, averaged
    alone = st.Trainer(loss=F.cross_entropy).evaluate(ddp_train.graph(), val)
    assert r0["evaluated"] == pytest.approx(alone, rel=1e-6)


@pytest.mark.slow
def test_a_remembered_fit_under_torchrun_runs_once_as_one_ddp_run_then_every_rank_recalls(
    tmp_path,
):
    # every rank calls with the same key: rank 1 used to wait on the key's lock while rank
    # 0, holding it, waited for rank 1 in DDP
    for _ in range(2):
        assert torchrun(tmp_path, script="ddp_remember.py") == 0, said(tmp_path)
    got = {
        (r, j): torch.load(tmp_path / f"remember-rank{r}-{j}.pt", weights_only=True)
        for r in (0, 1)
        for j in (0, 1)
    }
    assert [got[r, 0]["recalled"] for r in (0, 1)] == [False, False]  # one run, both ranks
    assert [got[r, 1]["recalled"] for r in (0, 1)] == [True, True]  # then recalled by both
    for r, j in got:
        assert got[r, j]["losses"] == got[0, 0]["losses"]
        for name, value in got[0, 0]["state"].items():
            assert torch.equal(got[r, j]["state"][name], value)


@pytest.mark.slow
def test_a_remembered_fit_under_torchrun_waits_out_another_jobs_lock_past_the_group_timeout(
    tmp_path,
):
    # rank 0 waits 10 s for the key's lock (another job computing the run) under a 4 s
    # process-group timeout: it tells the other ranks it waits each second; before, rank 1
    # sat in one broadcast for the decision and timed out
    code = torchrun(tmp_path, "--held", "10", script="ddp_remember.py")
    assert code == 0, said(tmp_path)
    got = [torch.load(tmp_path / f"remember-rank{r}-0.pt", weights_only=True) for r in (0, 1)]
    assert [g["recalled"] for g in got] == [False, False]
    assert got[0]["losses"] == got[1]["losses"]


@pytest.mark.parametrize("unset", [("RANK", "MASTER_ADDR", "MASTER_PORT"), ("MASTER_PORT",)])
def test_world_size_without_torchruns_other_variables_names_them_and_torchrun(monkeypatch, unset):
    import torch.distributed as dist

    from somatize.errors import SettingError

    assert not dist.is_initialized()
    env = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in unset:
        monkeypatch.delenv(name)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    batches = [(torch.randn(4, 3), torch.randint(0, 2, (4,)))]
    with pytest.raises(SettingError) as caught:  # (torch named one variable, not torchrun)
        trainer.fit(torch.nn.Linear(3, 2), batches)
    said = str(caught.value)
    assert "WORLD_SIZE=2 is set" in said and ", ".join(unset) in said
    assert "torchrun --nproc_per_node=2" in said and "unset WORLD_SIZE" in said
    assert not dist.is_initialized()


def test_a_rank_whose_peers_never_start_says_so_while_it_waits(tmp_path):
    """torch waits in init_process_group until its timeout, silently; a note on stderr."""
    import os
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(port)
    env.pop("TORCHELASTIC_RUN_ID", None)
    code = "import somatize.torch.ddp as d; d._WAIT_NOTE_S = 0.5; d.setup()"
    err = tmp_path / "stderr"
    with err.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=out)
        try:
            deadline = time.monotonic() + 60
            while "somatize: rank 0" not in err.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, err.read_text()  # (it waits; it must not exit)
                time.sleep(0.2)
        finally:
            proc.kill()
            proc.wait(timeout=30)
    said = err.read_text()
    assert "rank 0 of 2 has waited 0.5 s in torch.distributed.init_process_group" in said
    assert f"127.0.0.1:{port} (this process was not started by torchrun)" in said
    assert "every rank must start and call fit()" in said
    assert "torchrun --nproc_per_node=2 script.py" in said
