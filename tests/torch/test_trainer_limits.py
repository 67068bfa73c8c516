"""Options(limit_train_batches=, limit_val_batches=): Lightning's limits, against plain loops,
with max_steps, accumulation, schedulers, the progress total, and bitwise resume."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Recorder
from somatize.errors import SettingError
from somatize.torch.batches import epoch_batches
from somatize.watchers import FitStart, StepEnd
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer
from tests.torch.test_resume_random_data import LOADERS, CrashingLoss
from tests.torch.trainer_helpers import Capture, batches, make_graph, plain_copy, plain_state, quiet


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def plain_run(g, epochs, per_epoch):
    """A plain PyTorch loop over ``per_epoch(epoch)``'s batches: losses and final state."""
    plain = plain_copy(g)
    opt = sgd(list(plain.parameters()))
    losses = []
    for epoch in range(epochs):
        for x, y in per_epoch(epoch):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(plain(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, plain_state(plain)


def assert_equals_plain(result, losses, state):
    assert result.losses == losses  # bitwise: the same ops in the same order
    for name, value in state.items():
        assert torch.equal(result.state[name], value), name


# -- bad values, refused when Options are made or when fit starts ------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"limit_train_batches": 0}, r"limit_train_batches=0\) would train on no batch"),
        ({"limit_val_batches": 0}, r"fit without val="),
        ({"limit_train_batches": 1.5}, r"must be in \(0, 1\]"),
        (
            {"limit_train_batches": 2.0},
            r"for a count of batches pass an int \(limit_train_batches=2\)",
        ),
        ({"limit_val_batches": 0.0}, r"limit_val_batches=0.0\) is a fraction"),
        ({"limit_train_batches": True}, r"must be a count of batches"),
        ({"limit_val_batches": "10"}, r"must be a count of batches"),
        ({"limit_train_batches": float("nan")}, r"must be in \(0, 1\]"),
    ],
)
def test_bad_limits_are_refused_when_options_are_made(kw, match):
    with pytest.raises(SettingError, match=match):
        st.Options(**kw)


def test_a_fraction_of_data_without_a_length_is_refused_before_any_step():
    g = make_graph()
    before = {k: v.clone() for k, v in st.state(g).items()}
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, options=quiet(limit_train_batches=0.5)
    )
    with pytest.raises(SettingError, match=r"fraction of the data's length.*generator.*=100"):
        trainer.fit(g, (b for b in batches(4)))
    assert all(torch.equal(v, before[k]) for k, v in st.state(g).items())  # nothing trained
    # a count needs no length; 1.0 is "all" on anything
    counted = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet(limit_train_batches=2))
    assert counted.fit(make_graph(), (b for b in batches(4))).steps == 2
    whole = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet(limit_train_batches=1.0))
    assert whole.fit(make_graph(), (b for b in batches(4))).steps == 4


def test_a_fraction_too_small_to_take_a_batch_is_refused_naming_the_smallest():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet(limit_val_batches=0.1))
    with pytest.raises(SettingError, match=r"int\(5 \* 0.1\) = 0 of the 5 batches.*1/5"):
        trainer.fit(make_graph(), batches(2), val=batches(5))


# -- what a limited epoch trains on -------------------------------------------------------


@pytest.mark.parametrize(("limit", "n"), [(2, 2), (0.5, 2), (0.99, 4), (1.0, 5), (9, 5)])
def test_a_limited_epoch_equals_a_plain_loop_over_its_first_batches(limit, n):
    g, data = make_graph(), batches(5)
    losses, state = plain_run(g, 3, lambda epoch: data[:n])
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=3,
        options=quiet(shuffle=False, limit_train_batches=limit),
    ).fit(g, data)
    assert_equals_plain(result, losses, state)
    assert (result.steps, result.epochs, result.num_examples) == (3 * n, 3, 10 * n)


def test_a_shuffled_limited_epoch_takes_the_first_batches_of_each_epochs_order():
    data = batches(6)
    g = make_graph()
    orders = [list(epoch_batches(data, epoch, 3, True))[:2] for epoch in range(3)]
    taken = [[next(i for i, b in enumerate(data) if b is o) for o in order] for order in orders]
    assert len({tuple(t) for t in taken}) > 1  # another subset each epoch (Lightning's too)
    losses, state = plain_run(g, 3, lambda epoch: orders[epoch])
    result = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, epochs=3, seed=3, options=quiet(limit_train_batches=2)
    ).fit(g, data)
    assert_equals_plain(result, losses, state)


def test_a_limited_dataloader_equals_a_plain_loop_and_counts_what_it_trains_on():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=6)  # 7 batches, the last of 4
    g = make_graph()
    losses, state = plain_run(g, 2, lambda epoch: list(loader)[:3])  # int(7 * 0.5)
    result = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, epochs=2, options=quiet(limit_train_batches=0.5)
    ).fit(g, loader)
    assert_equals_plain(result, losses, state)
    assert result.num_examples == 18  # 3 batches of 6, not the dataset's 40


def test_a_limit_with_accumulation_ends_each_epoch_with_a_smaller_group():
    data = batches(6)
    opts: list[Capture] = []
    rec = Recorder()
    g = make_graph()
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: opts.append(Capture(ps)) or opts[-1],
        epochs=2,
        watchers=[rec],
        options=quiet(shuffle=False, accumulate=2, limit_train_batches=3),
    ).fit(g, data)
    assert result.steps == 4  # groups of 2 + 1 batches, twice
    assert rec.of(FitStart)[0].total_steps == 4
    m = st.module(g)
    for got, group in zip(opts[0].grads, [data[0:2], data[2:3]] * 2):
        m.zero_grad()
        F.cross_entropy(
            m(torch.cat([b[0] for b in group])), torch.cat([b[1] for b in group])
        ).backward()
        for a, b in zip(got, [p.grad for p in m.parameters()]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("max_steps", "total"), [(None, 6), (4, 4), (100, 6)])
def test_the_progress_total_counts_limited_epochs_within_max_steps(max_steps, total):
    rec = Recorder()
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=3,
        max_steps=max_steps,
        watchers=[rec],
        options=quiet(limit_train_batches=2),
    ).fit(make_graph(), batches(5))
    assert rec.of(FitStart)[0].total_steps == total == result.steps


def test_a_per_epoch_scheduler_steps_where_the_limited_epoch_ends():
    rec = Recorder()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.8),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
        epochs=3,
        watchers=[rec],
        options=quiet(scheduler_every="epoch", limit_train_batches=2),
    ).fit(make_graph(), batches(5))
    assert [e.lr for e in rec.of(StepEnd)] == [0.8, 0.8, 0.4, 0.4, 0.2, 0.2]
    assert [e.epoch for e in rec.of(StepEnd)] == [0, 0, 1, 1, 2, 2]


def test_eval_every_steps_counts_the_steps_limited_epochs_take():
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=3,
        options=quiet(limit_train_batches=2, eval_every_steps=3),
    ).fit(make_graph(), batches(5), val=batches(1))
    assert [(m["step"], m["epoch"]) for m in result.metrics] == [(3, 1), (6, 2)]


# -- limited evaluations ----------------------------------------------------------------


@pytest.mark.parametrize(("limit", "n"), [(2, 2), (0.5, 2), (7, 5)])
def test_a_limited_evaluation_equals_evaluating_the_first_batches(limit, n):
    val = batches(4, seed=7) + batches(1, size=3, seed=8)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.0),  # the weights stay: comparable
        metrics={"acc": st.accuracy},
        options=quiet(limit_val_batches=limit),
    )
    g = make_graph()
    result = trainer.fit(g, batches(2), val=val)
    want = trainer.evaluate(g, val[:n])
    assert result.metrics[0] == {
        "step": 2,
        "epoch": 0,
        "val_loss": want["loss"],
        "val_acc": want["acc"],
    }
    assert trainer.evaluate(g, val) != want or n == 5  # evaluate() itself reads all it is given


def test_a_limited_evaluation_reads_no_batch_past_the_limit():
    read = []

    class Counting:
        def __iter__(self):
            for i, b in enumerate(batches(5, seed=7)):
                read.append(i)
                yield b

    st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, epochs=2, options=quiet(limit_val_batches=2)
    ).fit(make_graph(), batches(2), val=Counting())
    assert read == [0, 1, 0, 1, 0, 1]  # the sanity check, then two evaluations


# -- checkpoints and resume -----------------------------------------------------------


@pytest.mark.parametrize(("crash_at", "last_step", "position"), [(7, 6, 2), (10, 9, 1)])
def test_resume_mid_limited_epoch_is_bitwise_identical(tmp_path, crash_at, last_step, position):
    limits = {"limit_train_batches": 4, "limit_val_batches": 1}
    reference = trainer(tmp_path / "ref", pruner=None, **limits).fit(graph(0), data(), val=data(2))
    assert reference.steps == 16  # 4 batches of 5, 4 epochs
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(crash_at)], pruner=None, **limits).fit(
            graph(0), data(), val=data(2)
        )
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert (last["step"], last["position"]) == (last_step, position)
    resumed = trainer(tmp_path, pruner=None, **limits).fit(
        graph(9), data(), val=data(2), resume="last"
    )
    assert_same(resumed, reference)


def limited_trainer(tmp_path, loss=F.cross_entropy, watchers=()):
    return st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=2e-2),
        epochs=3,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=3, keep=2),
        watchers=watchers,
        seed=5,
        options=st.Options(progress=False, limit_train_batches=0.75),  # 5 of 7 batches
    )


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("path", ["loop with watchers", "fast loop"])
def test_resume_mid_limited_epoch_with_random_data_is_bitwise_identical(tmp_path, loader, path):
    make = LOADERS[loader]
    reference = limited_trainer(tmp_path / "ref").fit(graph(0), make())
    assert reference.steps == 15
    crashing = (
        limited_trainer(tmp_path, watchers=[CrashAt(8)])
        if path == "loop with watchers"
        else limited_trainer(tmp_path, loss=CrashingLoss(8))
    )
    with pytest.raises(Crash):
        crashing.fit(graph(0), make())
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert (last["step"], last["epoch"], last["position"]) == (6, 1, 1)
    resumed = limited_trainer(tmp_path).fit(graph(7), make(), resume="last")
    assert_same(resumed, reference)
