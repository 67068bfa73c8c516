"""fp16 with a gradient scaler: equal to plain PyTorch's autocast + GradScaler loop, checkpointed,
resumed bitwise."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer


def test_fp16_equals_a_plain_autocast_and_grad_scaler_loop():
    batches = data(4)
    g = graph(0)
    plain = graph(0)
    body, head = plain["body"], plain["head"]
    torch.manual_seed(0)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        seed=0,
        options=st.Options(precision="fp16", shuffle=False, progress=False, clip_grad_norm=0.5),
    ).fit(g, batches)

    params = [*body.lin.parameters(), *head.lin.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(0)  # the Trainer seeds the run: the same dropout masks
    body.drop.train()
    losses = []
    for _ in range(2):
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                out = head.lin(body.drop(torch.relu(body.lin(x))))
                loss = F.cross_entropy(out, y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            scaler.step(opt)
            scaler.update()
            losses.append(float(loss.detach().float()))
    assert result.losses == pytest.approx(losses, rel=0, abs=0)
    assert torch.equal(result.state["head.lin.weight"], head.lin.weight.detach())
    assert torch.equal(result.state["body.lin.weight"], body.lin.weight.detach())


def test_fp16_checkpoints_hold_the_scaler_and_resume_bitwise(tmp_path):
    reference = trainer(tmp_path / "ref", precision="fp16").fit(graph(0), data(), val=data(2))
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(7)], precision="fp16").fit(
            graph(0), data(), val=data(2)
        )
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert last["scaler"]["scale"] == 65536.0 and last["scaler"]["_growth_tracker"] == 6
    resumed = trainer(tmp_path, precision="fp16").fit(graph(9), data(), val=data(2), resume="last")
    assert_same(resumed, reference)


def test_resuming_an_fp32_checkpoint_in_fp16_is_refused(tmp_path):
    from somatize.errors import CheckpointError

    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(4)]).fit(graph(0), data(), val=data(2))
    with pytest.raises(CheckpointError, match="without one"):
        trainer(tmp_path, precision="fp16").fit(graph(0), data(), val=data(2), resume="last")
