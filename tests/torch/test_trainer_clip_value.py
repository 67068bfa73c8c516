"""``Options(clip_grad_value=v)``: ``nn.utils.clip_grad_value_`` once per optimizer step on
the gradient the step uses, checked against plain PyTorch loops written by hand — the fast
path, the general one, accumulation, micro-batches, fp16, ``lr_find`` — and on resume."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize.torch import loop
from somatize.torch.resumed_optimizer import check_clip
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer
from tests.torch.test_trainer_lr_find import data as lr_data
from tests.torch.test_trainer_lr_find import net as lr_net
from tests.torch.trainer_helpers import (
    batches,
    make_graph,
    plain_state,
    porter_loop,
    quiet,
)

V = 0.02  # below many of this net's gradient elements: the clamp bites


class Seen:
    """A watcher: any watcher makes the Trainer take its general loop, not the fast one."""

    def on_event(self, event) -> None:
        pass


def _plain(data, k: int, mb: int, fp16: bool, v: float | None) -> tuple[list[float], dict, float]:
    """The porter's loop, clipped by value before ``opt.step()``; also the largest gradient
    element seen before clipping."""
    largest = [0.0]

    def clip(m: nn.Module) -> None:
        largest[0] = max(largest[0], *(float(p.grad.abs().max()) for p in m.parameters()))
        if v is not None:
            nn.utils.clip_grad_value_(m.parameters(), v)

    losses, m = porter_loop(data, k, mb, fp16, clip)
    return losses, plain_state(m), largest[0]


@pytest.mark.parametrize(
    ("k", "mb", "fp16", "watchers", "fast"),
    [
        (1, 1, False, False, True),
        (1, 1, False, True, False),
        (2, 1, False, False, False),
        (1, 2, False, False, False),
        (2, 2, False, False, False),
        (2, 2, True, False, False),
    ],
    ids=["fast path", "general path", "accumulate=2", "micro_batches=2", "both", "fp16"],
)
def test_clipping_by_value_equals_a_plain_loop(monkeypatch, k, mb, fp16, watchers, fast):
    took = []
    fast_epoch = loop.fast_epoch
    monkeypatch.setattr(loop, "fast_epoch", lambda *a: took.append(1) or fast_epoch(*a))
    data = batches(7, size=9)  # groups of 2 end in a group of 1; chunks of 5 and 4 rows
    g = make_graph()
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        micro_batches=mb,
        watchers=[Seen()] if watchers else [],
        options=quiet(
            shuffle=False, accumulate=k, clip_grad_value=V, precision="fp16" if fp16 else "32"
        ),
    ).fit(g, data)
    assert bool(took) == fast  # the road this case is about was taken
    losses, state, largest = _plain(data, k, mb, fp16, V)
    assert largest > 2 * V  # some gradient element was clamped: the test can fail
    assert result.losses == losses
    assert result.state.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(result.state[name], value), name
    _, unclipped, _ = _plain(data, k, mb, fp16, None)
    assert not torch.equal(unclipped["linear.lin.weight"], state["linear.lin.weight"])


def test_lr_find_clips_by_value_as_a_step_pre_hook_would():
    def hooked(params):  # docs/trainer.md's recipe, checked in test_trainer_param_groups.py
        opt = torch.optim.SGD(params, lr=0.5, momentum=0.9)
        opt.register_step_pre_hook(lambda *_: nn.utils.clip_grad_value_(params, 0.01))
        return opt

    def find(optimizer, **o):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=optimizer,
            options=st.Options(shuffle=False, progress=False, **o),
        ).lr_find(lr_net(), lr_data(), min_lr=1e-3, max_lr=3.0, steps=15, stop_at=None)

    def sgd(ps):
        return torch.optim.SGD(ps, lr=0.5, momentum=0.9)

    clipped = find(sgd, clip_grad_value=0.01)
    assert clipped.raw_losses == find(hooked).raw_losses
    assert clipped.raw_losses != find(sgd).raw_losses  # the clamp bit


def test_resuming_with_the_same_clip_grad_value_is_silent_and_exact(tmp_path):
    reference = trainer(tmp_path / "ref", clip_grad_value=0.05).fit(graph(0), data(), val=data(2))
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(7)], clip_grad_value=0.05).fit(
            graph(0), data(), val=data(2)
        )
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert (last["clip_grad_value"], last["clip_grad_norm"]) == (0.05, None)
    resumed = trainer(tmp_path, clip_grad_value=0.05).fit(
        graph(9), data(), val=data(2), resume="last"
    )  # (a warning would fail: pytest makes warnings errors)
    assert_same(resumed, reference)
    unclipped = trainer(tmp_path / "plain").fit(graph(0), data(), val=data(2))
    assert unclipped.losses != reference.losses  # the clamp bit


def test_resuming_with_another_clip_grad_value_warns(tmp_path):
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(4)], clip_grad_value=0.5).fit(
            graph(0), data(), val=data(2)
        )
    with pytest.warns(
        UserWarning, match=r"clip_grad_value=0\.5\), this run has clip_grad_value=No"
    ):
        trainer(tmp_path).fit(graph(0), data(), val=data(2), resume="last")


def test_switching_from_norm_to_value_on_resume_warns_once_naming_both(tmp_path):
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(4)], clip_grad_norm=0.5).fit(
            graph(0), data(), val=data(2)
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, clip_grad_value=0.5).fit(graph(0), data(), val=data(2), resume="last")
    said = [str(w.message) for w in caught if "clip" in str(w.message)]
    assert len(said) == 1, said
    assert (
        "Options(clip_grad_norm=0.5, clip_grad_value=None), this run has clip_grad_norm=None, "
        "clip_grad_value=0.5" in said[0]
    )


def test_a_checkpoint_without_clip_grad_value_is_not_compared():
    older = {"clip_grad_norm": None}  # written before clip_grad_value was kept
    check_clip(older, {"clip_grad_norm": None, "clip_grad_value": 0.5})  # silent
    with pytest.warns(UserWarning, match=r"Options\(clip_grad_value=None\), this run has"):
        check_clip({**older, "clip_grad_value": None}, {"clip_grad_value": 0.5})


def test_an_overflow_under_fp16_is_still_skipped_by_the_scaler():
    """unscale_ finds an inf gradient before the clamp would make it v: no step is taken."""
    torch.manual_seed(0)
    net = nn.Linear(1, 1, bias=False)
    before = net.weight.detach().clone()
    data = [(torch.ones(4, 1), torch.zeros(4))] * 2

    def huge(out, y):  # d loss / d out is 1e6 * the scale: inf in float16, of one sign
        return out.float().sum() * 1e6

    result = st.Trainer(
        loss=huge,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=1,
        options=quiet(shuffle=False, precision="fp16", clip_grad_value=V),
    ).fit(net, data)
    assert result.steps == 2
    assert torch.equal(net.weight.detach(), before)  # a clamped inf was never stepped with
