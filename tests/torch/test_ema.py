"""Options(ema=): the weight average against torch's AveragedModel in a plain loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import CheckpointError, SettingError
from somatize.torch.ema import Average, swapped

DECAY = 0.9


class Net(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 8)
        self.norm = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.out(torch.relu(self.norm(self.lin(x))))))


def data(n: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Net().with_id("net"))


def plain(model: nn.Module, batches, steps_per_eval: int, val):
    """A plain loop with torch's AveragedModel (use_buffers=True), evaluated on the average."""
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, evals = [], []
    for i, (x, y) in enumerate(batches, 1):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        ema.update_parameters(model)
        losses.append(loss.item())
        if i % steps_per_eval == 0:
            ema.eval()
            with torch.no_grad():
                evals.append(sum(F.cross_entropy(ema(x), y).item() * len(y) for x, y in val) / 16)
    return ema, losses, evals


def test_the_fit_averages_as_averaged_model_and_evaluates_the_average():
    g, val = graph(), data(2, seed=1)
    twin = copy.deepcopy(st.module(g))
    ema, losses, evals = plain(twin, data(), 3, val)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        epochs=1,
        options=st.Options(progress=False, shuffle=False, ema=DECAY, eval_every_steps=3),
    ).fit(g, data(), val=val)
    assert result.losses == losses  # training runs on the trained weights
    assert [m["val_loss"] for m in result.metrics] == pytest.approx(evals, rel=1e-6, abs=0)
    averaged = ema.module.state_dict()
    for name, value in result.state.items():  # the model holds the average at the end
        if value.is_floating_point():
            assert torch.equal(value, averaged[name]), name
    assert result.state["net.norm.num_batches_tracked"] == 6  # integers: the model's own


def test_a_resumed_run_continues_the_average_bitwise(tmp_path):
    from tests.torch.test_checkpoint_resume import Crash, CrashAt

    def trainer(path, watchers=()):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
            epochs=2,
            checkpoint=st.Checkpointing(path, every_steps=2),
            watchers=watchers,
            options=st.Options(progress=False, ema=DECAY),
        )

    reference = trainer(tmp_path / "ref").fit(graph(), data())
    with pytest.raises(Crash):
        trainer(tmp_path / "cut", [CrashAt(7)]).fit(graph(), data())
    payload = st.load_checkpoint(st.Checkpointing(tmp_path / "cut").last())
    assert payload["ema"]["updates"] == 6
    resumed = trainer(tmp_path / "cut").fit(graph(), data(), resume="last")
    assert resumed.losses == reference.losses
    for name, value in reference.state.items():
        assert torch.equal(value, resumed.state[name]), name


def test_the_checkpoint_holds_the_trained_weights_and_the_average_apart(tmp_path):
    g, made = graph(), []
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: made.append(torch.optim.SGD(ps, lr=0.5)) or made[-1],
        epochs=1,
        checkpoint=st.Checkpointing(tmp_path),
        options=st.Options(progress=False, ema=DECAY),
    ).fit(g, data())
    payload = st.load_checkpoint(st.Checkpointing(tmp_path).last())
    held = st.module(g).state_dict()  # the average, after fit
    ema = payload["ema"]["state"]
    assert set(ema) == {n for n, t in held.items() if t.is_floating_point()}
    for name, value in ema.items():
        assert torch.equal(value, held[name]), name
    assert not torch.equal(payload["model"]["net.lin.weight"], held["net.lin.weight"])
    assert len(made[0]._optimizer_step_post_hooks) == 0  # the update leaves with the fit


def test_loading_a_checkpoints_average_alone_says_to_load_it_over_the_model(tmp_path):
    """Found by a deployment review: ``load_state(g, payload["ema"])`` and
    ``load_state(g, payload["ema"]["state"])`` (no integer buffers) asked whether the state
    came from another graph."""
    from somatize.errors import StateError

    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        checkpoint=st.Checkpointing(tmp_path),
        options=st.Options(progress=False, ema=DECAY),
    ).fit(graph(), data(2))
    payload = st.load_checkpoint(st.Checkpointing(tmp_path).last())
    fix = r"\{\*\*payload\['model'\], \*\*payload\['ema'\]\['state'\]\}"
    for alone in (payload["ema"], payload["ema"]["state"]):
        with pytest.raises(StateError, match=r"weight average.*" + fix):
            st.load_state(graph(), alone)
    st.load_state(graph(), {**payload["model"], **payload["ema"]["state"]})


@pytest.mark.parametrize("ema", [DECAY, None])
def test_a_whole_checkpoint_loads_the_weights_its_evaluation_judged(tmp_path, ema):
    """``load_state(g, load_checkpoint(best))``: under EMA the average (what ranked the
    checkpoint best), else the trained weights; evaluated again, it gives the best value."""
    val = data(2, seed=1)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        epochs=3,
        checkpoint=st.Checkpointing(tmp_path, best=1),
        options=st.Options(progress=False, ema=ema),
    ).fit(graph(), data(), val=val)
    payload = st.load_checkpoint(result.best_checkpoint)
    served = graph()
    st.load_state(served, payload)
    want = {**payload["model"], **(payload["ema"]["state"] if ema else {})}
    got = st.state(served)
    assert all(torch.equal(got[k], want[k]) for k in want) and set(got) == set(want)
    if ema:  # (the trained weights are not the average)
        assert not torch.equal(got["net.lin.weight"], payload["model"]["net.lin.weight"])
    measured = st.Trainer(loss=F.cross_entropy).evaluate(served, val)["loss"]
    assert measured == pytest.approx(result.best, rel=1e-5)


def test_average_update_matches_averaged_model_and_swaps_back():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    model[0].bias.requires_grad_(False)  # frozen: not averaged, the model's own
    ref = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.5), use_buffers=True)
    avg = Average(model, 0.5)
    assert "0.bias" not in avg.names and "1.num_batches_tracked" not in avg.names
    for _ in range(3):
        with torch.no_grad():
            model[0].weight.add_(1.0)
            model(torch.randn(4, 3))  # moves the running statistics
        ref.update_parameters(model)
        avg.update()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with swapped(avg):
        for name, value in ref.module.state_dict().items():
            if value.is_floating_point():
                assert torch.equal(model.state_dict()[name], value), name
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan"), "0.9", True])
def test_a_decay_outside_zero_one_is_refused(bad):
    with pytest.raises(SettingError, match=r"Options\(ema="):
        st.Options(ema=bad)


def test_a_checkpoint_average_for_another_model_is_refused(tmp_path):
    from somatize.torch.ema import restore_average

    avg = Average(nn.Linear(2, 2), 0.9)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        restore_average({"ema": {"updates": 1, "state": {"other": torch.zeros(1)}}}, avg, "x")
    with pytest.warns(UserWarning, match="holds no weight average"):
        restore_average({}, avg, "x")
    assert avg.updates == 0


@pytest.mark.parametrize(
    ("ema", "said"),
    [
        (None, r"holds a weight average \(written with Options\(ema=0\.9\)\), and this run has no"),
        (0.5, r"kept with Options\(ema=0\.9\), and this run's is Options\(ema=0\.5\)"),
    ],
)
def test_resuming_with_the_average_dropped_or_its_decay_changed_warns(tmp_path, ema, said):
    def trainer(decay, epochs):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
            epochs=epochs,
            checkpoint=st.Checkpointing(tmp_path),
            options=st.Options(progress=False, ema=decay),
        )

    trainer(DECAY, 1).fit(graph(), data())  # (silent: the run's result was the average)
    with pytest.warns(UserWarning, match=said):
        trainer(ema, 2).fit(graph(), data(), resume="last")
