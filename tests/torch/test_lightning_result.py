"""result(trainer, lg): the TrainResult of a Lightning run fed to fedavg, and equal to the
somatize Trainer's from the same weights (also under gradient accumulation)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")


import somatize.torch as st  # noqa: E402
from somatize import Graph  # noqa: E402
from somatize.torch.lightning import LightningGraph, result  # noqa: E402
from tests.torch.lightning_graphs import (  # noqa: E402
    _assert_same_state,
    _graph,
    _lg,
    _loader,
    _trainer,
)
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    NO_VAL,  # fitting without validation data is a normal run here, as in the Trainer
]


# -- level 3 ----------------------------------------------------------------------------


def _weighted_average(results):
    """The stand-in for st.fedavg while it is not on this branch: weighted by num_examples."""
    total = sum(r.num_examples for r in results)
    return {
        k: sum(r.state[k] * (r.num_examples / total) for r in results) for k in results[0].state
    }


def test_result_feeds_fedavg(tmp_path):
    start = st.state(_graph(0))
    results = []
    for n, seed in ((32, 1), (96, 2)):
        g = _graph(9)
        st.load_state(g, start)
        lg = _lg(g)
        trainer = _trainer(tmp_path, max_epochs=2)
        trainer.fit(lg, _loader(n, seed), _loader(16, seed + 10))
        r = result(trainer, lg)
        assert isinstance(r, st.TrainResult)
        assert (r.num_examples, r.steps, r.epochs) == (n, trainer.global_step, 2)
        assert r.losses == lg.losses and len(r.losses) == r.steps
        assert r.metrics == lg.history and r.best == min(m["val_loss"] for m in r.metrics)
        assert not r.pruned and r.checkpoint is None and r.seconds > 0
        _assert_same_state(r.state, st.state(g), rtol=0, atol=0)
        assert r.metric("val_acc") == lg.history[-1]["val_acc"]  # what summarize reads
        results.append(r)
    average = getattr(st, "fedavg", _weighted_average)(results)
    a, b = results[0].state, results[1].state
    _assert_same_state(average, {k: (32 * a[k] + 96 * b[k]) / 128 for k in a}, rtol=1e-5, atol=1e-6)
    g = _graph(5)
    st.load_state(g, average)  # matched by name: the state of a Lightning run fits module(g)


# -- the differential test --------------------------------------------------------------


def _twins() -> tuple[Graph, Graph, dict[str, torch.Tensor]]:
    """Two graphs starting from the same weights (one for each trainer), and those weights."""
    start = st.state(_graph(0))
    ours, theirs = _graph(1), _graph(2)
    st.load_state(ours, start)
    st.load_state(theirs, start)
    return ours, theirs, start


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.3)


def test_somatize_trainer_and_lightning_end_with_equal_weights(tmp_path):
    ours, theirs, start = _twins()
    sgd = _sgd

    def sched(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    somatize_trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=sgd,
        scheduler=sched,
        epochs=3,
        seed=0,
        options=st.Options(shuffle=False, progress=False, scheduler_every="epoch"),
    )
    ref = somatize_trainer.fit(ours, _loader())

    lg = LightningGraph(theirs, loss=nn.functional.cross_entropy, optimizer=sgd, scheduler=sched)
    trainer = _trainer(tmp_path, max_epochs=3)
    trainer.fit(lg, _loader())
    r = result(trainer, lg)

    assert (r.steps, r.epochs, r.num_examples) == (ref.steps, ref.epochs, ref.num_examples)
    assert r.losses == pytest.approx(ref.losses, rel=1e-6)
    _assert_same_state(r.state, ref.state)
    assert not torch.equal(r.state["out.lin.weight"], start["out.lin.weight"])


def test_under_accumulation_losses_are_one_per_step_as_the_somatize_trainers(tmp_path):
    ours, theirs, _ = _twins()
    sgd = _sgd

    options = st.Options(shuffle=False, progress=False, accumulate=2)
    ref = st.Trainer(loss=nn.functional.cross_entropy, optimizer=sgd, epochs=2, options=options)
    ref_result = ref.fit(ours, _loader())  # 4 batches of 16 an epoch: 2 steps an epoch
    lg = LightningGraph(theirs, loss=nn.functional.cross_entropy, optimizer=sgd)
    trainer = _trainer(tmp_path, max_epochs=2, accumulate_grad_batches=2)
    trainer.fit(lg, _loader())
    r = result(trainer, lg)
    assert trainer.global_step == ref_result.steps == 4
    assert len(lg.losses) == 4  # one per optimizer step, not one per batch
    assert r.losses == pytest.approx(ref_result.losses, rel=1e-6)
    _assert_same_state(r.state, ref_result.state)


def test_an_epoch_stopped_in_its_middle_counts_here_and_not_under_the_somatize_trainer(tmp_path):
    # lightning.md, "An epoch stopped in its middle": Lightning ends the epoch max_steps (or
    # EarlyStopping at a mid-epoch validation) stops, and counts it in current_epoch
    ours, theirs, _ = _twins()
    options = st.Options(shuffle=False, progress=False)
    ref = st.Trainer(
        loss=nn.functional.cross_entropy, optimizer=_sgd, epochs=3, max_steps=6, options=options
    ).fit(ours, _loader())  # 4 batches an epoch: stopped at the second's second step
    lg = LightningGraph(theirs, loss=nn.functional.cross_entropy, optimizer=_sgd)
    trainer = _trainer(tmp_path, max_epochs=3, max_steps=6)
    trainer.fit(lg, _loader())
    r = result(trainer, lg)
    assert r.steps == ref.steps == 6 and r.losses == pytest.approx(ref.losses, rel=1e-6)
    _assert_same_state(r.state, ref.state)
    assert (r.epochs, len(r.epoch_losses)) == (2, 2)  # the stopped epoch's mean: 2 steps'
    assert (ref.epochs, len(ref.epoch_losses)) == (1, 1)  # finished epochs only
    assert r.epoch_losses[0] == pytest.approx(ref.epoch_losses[0], rel=1e-6)
    assert r.epoch_losses[1] == pytest.approx(sum(ref.losses[4:]) / 2, rel=1e-6)


@pytest.mark.slow  # (two processes spawned, each importing torch and lightning)
@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_result_of_a_fit_in_spawned_processes_is_refused_naming_ddp_under_torchrun(tmp_path):
    import functools

    from somatize.errors import SettingError

    lg = _lg(_graph(), optimizer=functools.partial(torch.optim.SGD, lr=0.1))  # (picklable)
    before = st.state(lg.graph)
    trainer = _trainer(tmp_path, max_epochs=1, devices=2, strategy="ddp_spawn")
    trainer.fit(lg, _loader())
    moved = st.state(lg.graph)  # the weights came back to this process; the run did not
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    assert lg.losses == [] and trainer.global_step == 0
    # (before: a TrainResult with steps=0, num_examples=0, losses=[] — fedavg weighs it zero)
    with pytest.raises(SettingError, match=r"strategy=\"ddp\" launched by torchrun"):
        result(trainer, lg)
