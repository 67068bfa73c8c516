"""``StepEnd.grad_norm``: the gradients' total norm before clipping, under
``Options(clip_grad_norm=)`` or ``Options(log_grad_norm=True)``, checked against a plain
PyTorch loop's ``clip_grad_norm_(params, inf)`` — accumulation, micro-batches, clipping
that bites, clipping by value, fp16 — and absent by default."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import JsonLines, Recorder
from somatize.errors import SettingError
from somatize.torch import loop
from somatize.watchers import StepEnd
from tests.torch.trainer_helpers import (
    batches,
    make_graph,
    plain_state,
    porter_loop,
    quiet,
)

C = 0.2  # below most steps' norm: clipping by norm bites
V = 0.02  # below many gradient elements: clipping by value bites


def _plain(data, k, mb, fp16, clip, value) -> tuple[list[float], dict]:
    """The porter's loop, logging ``clip_grad_norm_(params, inf)`` before it clips (after
    the scaler's unscale under fp16): the norm Lightning's ``grad_norm`` shows."""
    norms = []

    def clipped(m: nn.Module) -> None:
        norms.append(float(nn.utils.clip_grad_norm_(m.parameters(), math.inf)))
        if clip is not None:
            nn.utils.clip_grad_norm_(m.parameters(), clip)
        if value is not None:
            nn.utils.clip_grad_value_(m.parameters(), value)

    _, m = porter_loop(data, k, mb, fp16, clipped)
    return norms, plain_state(m)


@pytest.mark.parametrize(
    ("k", "mb", "fp16", "options"),
    [
        (1, 1, False, {"clip_grad_norm": C}),
        (2, 2, False, {"clip_grad_norm": C}),
        (2, 2, False, {"clip_grad_norm": C, "nonfinite": "ignore"}),
        (2, 2, False, {"log_grad_norm": True}),
        (1, 2, False, {"log_grad_norm": True, "clip_grad_value": V}),
        (2, 2, True, {"clip_grad_norm": C}),
        (2, 2, True, {"log_grad_norm": True}),
    ],
    ids=[
        "clip, one batch",
        "clip, accumulate=2 micro_batches=2",
        "clip, nothing read back",
        "log_grad_norm",
        "log_grad_norm and clip_grad_value",
        "fp16 clip",
        "fp16 log_grad_norm",
    ],
)
def test_the_norm_told_is_a_plain_loops_before_clipping(k, mb, fp16, options):
    data = batches(7, size=9)  # groups of 2 end in a group of 1; chunks of 5 and 4 rows
    recorder = Recorder()
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        micro_batches=mb,
        watchers=[recorder],
        options=quiet(shuffle=False, accumulate=k, precision="fp16" if fp16 else "32", **options),
    ).fit(make_graph(), data)
    told = [e.grad_norm for e in recorder.of(StepEnd)]
    norms, state = _plain(
        data, k, mb, fp16, options.get("clip_grad_norm"), options.get("clip_grad_value")
    )
    assert told == norms
    assert all(math.isfinite(n) for n in norms)
    if "clip_grad_norm" in options:  # clipping bit: the norm told is the one before it
        assert all(n > C for n in norms)
    for name, value in state.items():  # and the run trained as the plain loop did
        assert torch.equal(result.state[name], value), name


def test_no_norm_is_told_by_default_nor_computed_without_watchers(monkeypatch):
    recorder = Recorder()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[recorder],
        options=quiet(),
    ).fit(make_graph(), batches(3))
    steps = recorder.of(StepEnd)
    assert len(steps) == 3 and all(e.grad_norm is None for e in steps)

    # without watchers nobody reads it: the run keeps the fast path and computes nothing
    took, computed = [], []
    fast_epoch = loop.fast_epoch
    monkeypatch.setattr(loop, "fast_epoch", lambda *a: took.append(1) or fast_epoch(*a))
    monkeypatch.setattr(nn.utils, "get_total_norm", lambda *a, **kw: computed.append(1))
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=quiet(log_grad_norm=True),
    ).fit(make_graph(), batches(3))
    assert took and not computed


def test_a_step_the_fp16_scaler_skips_tells_the_overflowed_norm():
    torch.manual_seed(0)
    net = nn.Linear(1, 1, bias=False)
    before = net.weight.detach().clone()
    data = [(torch.ones(4, 1), torch.zeros(4))] * 2

    def huge(out, y):  # d loss / d out is 1e6 * the scale: inf in float16
        return out.float().sum() * 1e6

    recorder = Recorder()
    st.Trainer(
        loss=huge,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[recorder],
        options=quiet(shuffle=False, precision="fp16", log_grad_norm=True),
    ).fit(net, data)
    told = [e.grad_norm for e in recorder.of(StepEnd)]
    assert len(told) == 2 and not any(math.isfinite(n) for n in told)  # (inf or nan)
    assert torch.equal(net.weight.detach(), before)  # the scaler skipped both steps


def test_the_run_log_carries_the_norm(tmp_path):
    recorder = Recorder()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[recorder, JsonLines(tmp_path / "run.jsonl")],
        options=quiet(log_grad_norm=True),
    ).fit(make_graph(), batches(3))
    logged = [
        r["grad_norm"] for r in JsonLines.read(tmp_path / "run.jsonl") if r["event"] == "StepEnd"
    ]
    assert logged == [e.grad_norm for e in recorder.of(StepEnd)]
    assert all(isinstance(n, float) and n > 0 for n in logged)


def test_log_grad_norm_is_a_bool():
    with pytest.raises(SettingError, match="log_grad_norm must be True or False"):
        st.Options(log_grad_norm="yes")  # type: ignore[arg-type]


def test_before_torch_2_6_the_norm_is_the_same_without_get_total_norm(monkeypatch):
    from somatize.torch.step import grad_norm

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    m[0].weight.requires_grad_(False)  # (a parameter without a gradient is left out)
    m(torch.randn(5, 4)).pow(2).sum().backward()
    params = list(m.parameters())
    monkeypatch.delattr(nn.utils, "get_total_norm", raising=False)
    assert float(grad_norm(params)) == pytest.approx(
        float(nn.utils.clip_grad_norm_(params, math.inf)), rel=1e-6
    )
    assert float(grad_norm([])) == 0.0
