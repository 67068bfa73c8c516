"""``Trainer.lr_find``: a learning-rate range test, against one written by hand in plain
PyTorch and Lightning's own suggestion (``somatize/torch/lr_find.py``)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.errors import SettingError
from somatize.torch import ddp

BETA = 0.98


def data(n: int = 8, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)
    ]


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def trainer(optimizer=None, **kwargs) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=optimizer or (lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9)),
        options=st.Options(shuffle=False, progress=False),
        **kwargs,
    )


def by_hand(model: nn.Module, batches, min_lr: float, max_lr: float, steps: int):
    """The range test in plain PyTorch: the rate of step i set by hand, each loss kept."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    lrs, raw, smoothed, average = [], [], [], 0.0
    for i in range(steps):
        x, y = batches[i % len(batches)]
        lr = min_lr * (max_lr / min_lr) ** (i / (steps - 1))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        lrs.append(lr)
        raw.append(loss.item())
        average = BETA * average + (1 - BETA) * raw[-1]
        smoothed.append(average / (1 - BETA ** len(raw)))
    return lrs, raw, smoothed


def test_the_range_test_is_the_one_written_by_hand_and_suggests_as_lightning_does():
    from lightning.pytorch.tuner.lr_finder import _LRFinder

    model, batches = net(), data()
    reference = copy.deepcopy(model)
    found = trainer().lr_find(model, batches, min_lr=1e-4, max_lr=3.0, steps=30, stop_at=None)
    lrs, raw, smoothed = by_hand(reference, batches, 1e-4, 3.0, 30)
    assert not found.stopped_early
    torch.testing.assert_close(found.lrs, lrs, rtol=1e-12, atol=0)
    torch.testing.assert_close(found.raw_losses, raw, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(found.losses, smoothed, rtol=1e-6, atol=1e-7)
    lightning = _LRFinder("exponential", 1e-4, 3.0, 30)
    lightning.results = {"lr": found.lrs, "loss": found.losses}
    assert found.suggestion is not None
    assert found.suggestion == lightning.suggestion()


def test_linear_mode_grows_the_rate_in_equal_steps():
    found = trainer().lr_find(net(), data(), min_lr=0.01, max_lr=0.5, steps=15, mode="linear")
    torch.testing.assert_close(
        found.lrs, [0.01 + (0.5 - 0.01) * i / 14 for i in range(15)], rtol=1e-12, atol=0
    )


def test_the_model_and_the_generators_are_put_back_so_a_fit_after_it_is_as_alone():
    batches = data()
    alone_model = net()
    alone = trainer(epochs=2).fit(alone_model, batches)

    model = net()
    model[0].eval()  # a mode of its own, kept
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    trainer().lr_find(model, batches, steps=20)
    torch.testing.assert_close(torch.rand(3), expected_draw, rtol=0, atol=0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert [m.training for m in model.modules()] == [True, False, True, True]
    model[0].train()
    after = trainer(epochs=2).fit(model, batches)
    assert after.losses == alone.losses
    for k, v in after.state.items():
        assert torch.equal(v, alone.state[k]), k


def test_a_diverging_loss_ends_the_test_once_it_passes_stop_at_times_its_best():
    found = trainer().lr_find(net(), data(), min_lr=1e-3, max_lr=1e4, steps=200)
    assert found.stopped_early and len(found.lrs) < 200
    *before, last = found.losses
    assert last > 4.0 * min(before) or not math.isfinite(last)
    assert all(x <= 4.0 * min(before[: i + 1]) for i, x in enumerate(before))
    assert found.suggestion is not None and found.suggestion < found.lrs[-1]


def test_a_non_finite_loss_ends_the_test_instead_of_the_process():
    calls = []

    def loss(out, y):
        calls.append(1)
        value = F.cross_entropy(out, y)
        return value * float("nan") if len(calls) == 15 else value

    t = st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    found = t.lr_find(net(), data(), steps=50)
    assert found.stopped_early and len(found.lrs) == 15 and math.isnan(found.raw_losses[-1])
    assert found.suggestion is not None and found.suggestion in found.lrs[10:14]


def test_param_groups_keep_their_ratio_to_the_first_group():
    made = []

    def two_groups(ps):
        ps = list(ps)
        opt = torch.optim.SGD([{"params": ps[:2], "lr": 1.0}, {"params": ps[2:], "lr": 0.1}])
        made.append(opt)
        return opt

    found = trainer(two_groups).lr_find(net(), data(), min_lr=1e-3, max_lr=1e-1, steps=14)
    last = [g["lr"] for g in made[-1].param_groups]
    assert found.lrs[-1] == pytest.approx(1e-1) and last[0] == pytest.approx(1e-1)
    assert last[1] == pytest.approx(last[0] / 10)


def test_no_checkpoint_and_no_watcher_of_the_trainer_is_written_or_told(tmp_path):
    recorder = Recorder()
    t = trainer(checkpoint=st.Checkpointing(tmp_path / "ckpt"), watchers=[recorder])
    t.lr_find(net(), data(), steps=14)
    assert recorder.events == []
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").glob("*.ckpt"))
    assert t.fit(net(), data(), resume="last").steps == 8  # a fresh start: nothing there


def test_data_read_once_gives_one_pass():
    found = trainer().lr_find(net(), iter(data(20)), steps=50)
    assert len(found.lrs) == 20 and not found.stopped_early and found.suggestion is not None


def test_too_few_steps_to_suggest_warns_and_suggests_nothing():
    with pytest.warns(UserWarning, match="too few to suggest"):
        found = trainer().lr_find(net(), data(), steps=12)
    assert len(found.lrs) == 12 and found.suggestion is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_lr": 0}, "min_lr=0"),
        ({"max_lr": -1.0}, "max_lr=-1.0"),
        ({"min_lr": 1.0, "max_lr": 0.1}, "below max_lr"),
        ({"steps": 1}, "at least 2"),
        ({"mode": "cosine"}, "'exponential' or 'linear'"),
        ({"stop_at": 0.5}, "above 1"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(SettingError, match=match):
        trainer().lr_find(net(), data(), **kwargs)


def test_no_optimizer_no_rate_and_torchrun_are_refused(monkeypatch):
    with pytest.raises(SettingError, match="optimizer factory"):
        st.Trainer(loss=F.cross_entropy).lr_find(net(), data())
    with pytest.raises(SettingError, match="positive rate"):
        trainer(lambda ps: torch.optim.SGD(ps, lr=0.0)).lr_find(net(), data())
    monkeypatch.setattr(ddp, "planned", lambda: (0, 2))
    with pytest.raises(SettingError, match="one process"):
        trainer().lr_find(net(), data())


def test_a_graph_is_tested_and_put_back_as_a_module_is():
    from tests.torch.trainer_helpers import batches, make_graph, quiet, sgd

    g = make_graph()
    before = {k: v.clone() for k, v in st.state(g).items()}
    t = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet())
    found = t.lr_find(g, batches(4), min_lr=1e-3, max_lr=1.0, steps=16)
    assert len(found.lrs) == 16 and found.suggestion in found.lrs
    assert all(torch.equal(v, before[k]) for k, v in st.state(g).items())
