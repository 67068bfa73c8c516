"""Day-one features combined, each checked against a plain PyTorch loop written by hand:
accumulation with an uneven last group, a per-step scheduler, clipping, fp16's scaler,
``nonfinite="skip"`` and EMA, together."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import somatize.torch as st
from tests.torch.trainer_helpers import batches, make_graph, plain_copy, quiet


def _decay(s):
    return 1.0 / (1 + s)


def _poisoned():
    data = batches(7)  # 7 batches: groups of 3 end in a group of 1, of 2 in one of 1
    x, y = data[3]
    x = x.clone()
    x[0, 0] = float("nan")
    data[3] = (x, y)
    return data


def _plain(data, k, clip, fp16, ema, loss, lr):
    m = plain_copy(make_graph())
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _decay)
    scaler = torch.amp.GradScaler("cpu") if fp16 else None
    avg = AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(ema)) if ema else None
    taken = skipped = 0
    for _ in range(3):
        for i in range(0, len(data), k):
            group = data[i : i + k]
            n = sum(len(y) for _, y in group)
            opt.zero_grad()
            total = 0.0
            for x, y in group:
                with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
                    part = loss(m(x), y) * (len(y) / n)
                total += part.detach().float()
                (scaler.scale(part) if fp16 else part).backward()
            if not torch.isfinite(total):
                skipped += 1
                continue
            if fp16:
                if clip:
                    scaler.unscale_(opt)
                    nn.utils.clip_grad_norm_(m.parameters(), clip)
                scale = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                moved = scaler.get_scale() >= scale  # the scaler skipped no step
            else:
                if clip:
                    nn.utils.clip_grad_norm_(m.parameters(), clip)
                opt.step()
                moved = True
            if avg is not None and moved:
                avg.update_parameters(m)
            sched.step()
            taken += 1
    return (avg.module if avg is not None else m), taken, skipped


def _large(out, y):
    return F.cross_entropy(out, y) * 3e4  # fp16 gradients overflow under the first scales


@pytest.mark.parametrize(
    ("k", "clip", "fp16", "ema"),
    [(3, None, False, None), (2, 0.05, False, 0.8), (3, None, True, 0.8), (2, 0.5, True, 0.8)],
)
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")
def test_accumulation_clipping_scaler_skip_and_ema_together_equal_a_plain_loop(k, clip, fp16, ema):
    data = _poisoned()
    loss, lr = (_large, 1e-5) if fp16 else (F.cross_entropy, 0.1)
    trainer = st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, _decay),
        epochs=3,
        options=quiet(
            shuffle=False,
            accumulate=k,
            clip_grad_norm=clip,
            nonfinite="skip",
            ema=ema,
            precision="fp16" if fp16 else "32",
        ),
    )
    g = make_graph()
    result = trainer.fit(g, data)
    want, taken, skipped = _plain(data, k, clip, fp16, ema, loss, lr)
    planned = 3 * -(-7 // k)  # the last group of each epoch is smaller, and steps
    assert trainer.planned_steps(data) == planned
    assert (result.steps, result.skipped) == (taken, skipped) == (planned - 3, 3)
    for a, b in zip(st.module(g).state_dict().values(), want.state_dict().values(), strict=True):
        assert torch.equal(a, b)
