"""State carried across steps (truncated BPTT): reset at epoch and evaluation starts, never a buffer."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError
from tests.torch.test_checkpoint_resume import Crash, CrashAt


class Recurrent(Node):
    def __init__(self) -> None:
        self.rnn = nn.GRU(3, 5, batch_first=True)
        self.out = nn.Linear(5, 2)
        self.hidden = st.Carry()
        self.starts: list[tuple[bool, bool]] = []  # (training, started from None) per call

    def forward(self, x, ctx):  # (batch, seq, 3)
        self.starts.append((ctx.training, self.hidden.value is None))
        out, h = self.rnn(x, self.hidden.value)
        self.hidden.set(h)
        return Done(Opaque(self.out(out[:, -1])))


def data(n: int):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(2, 4, 3, generator=gen), torch.randint(0, 2, (2,), generator=gen))
        for _ in range(n)
    ]


def test_carried_state_is_reset_at_epoch_and_evaluation_starts_and_given_back_after():
    torch.manual_seed(0)
    node = Recurrent()
    g = Graph.somatize(node)
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=st.Options(progress=False, shuffle=False, eval_every_steps=2),
    ).fit(g, data(3), val=data(2))
    train_t, val_t = (True, True), (False, True)
    assert node.starts == [
        val_t, (False, False),  # the sanity check before training (2 batches of val)
        train_t, (True, False),  # epoch 0: fresh, then carried
        val_t, (False, False),  # evaluation at step 2: fresh, then carried within it
        (True, False),  # training carries on from its own state, not the evaluation's
        train_t, val_t, (False, False), (True, False), (True, False),  # epoch 1 (eval at 4)
        val_t, (False, False),  # evaluation at step 6
    ]  # fmt: skip
    assert "hidden" not in " ".join(st.state(g))  # never a buffer
    assert not any("hidden" in k for k in st.module(g).state_dict())
    st.load_state(g, st.state(g))


def test_truncated_backprop_equals_a_plain_loop_with_detached_hidden_state():
    torch.manual_seed(0)
    node = Recurrent()
    g = Graph.somatize(node)
    rnn, out = __import__("copy").deepcopy(node.rnn), __import__("copy").deepcopy(node.out)
    batches = data(4)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False, shuffle=False),
    ).fit(g, batches)
    opt = torch.optim.SGD([*rnn.parameters(), *out.parameters()], lr=0.1)
    h, losses = None, []
    for x, y in batches:
        opt.zero_grad()
        o, h = rnn(x, h)
        loss = F.cross_entropy(out(o[:, -1]), y)
        loss.backward()
        opt.step()
        h = h.detach()
        losses.append(loss.item())
    assert result.losses == losses
    assert torch.equal(node.rnn.weight_hh_l0, rnn.weight_hh_l0)


def test_evaluate_and_predict_start_from_a_fresh_state():
    node = Recurrent()
    g = Graph.somatize(node)
    trainer = st.Trainer(loss=F.cross_entropy)
    first = trainer.predict(g, data(2))
    again = trainer.predict(g, data(2))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert trainer.evaluate(g, data(2)) == trainer.evaluate(g, data(2))


def test_carry_detaches_nested_values_unless_told_not_to():
    t = torch.ones(2, requires_grad=True) * 2
    c = st.Carry()
    c.set((t, [t], {"a": t}))
    assert not c.value[0].requires_grad and not c.value[1][0].requires_grad
    keep = st.Carry(detach=False)
    keep.set(t)
    assert keep.value.requires_grad
    keep.reset()
    assert keep.value is None


class Pair(Node):
    """An LSTM: its carried state is a tuple (h, c)."""

    def __init__(self) -> None:
        self.rnn = nn.LSTM(3, 5, batch_first=True)
        self.out = nn.Linear(5, 2)
        self.hidden = st.Carry()

    def forward(self, x, ctx):
        out, hc = self.rnn(x, self.hidden.value)
        self.hidden.set(hc)
        return Done(Opaque(self.out(out[:, -1])))


def carried_fit(ckpt, node, watchers=(), resume=None):
    torch.manual_seed(0)
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=2,
        checkpoint=st.Checkpointing(ckpt, every_steps=2),
        watchers=watchers,
        options=st.Options(progress=False, shuffle=False),
    ).fit(Graph.somatize(node()), data(5), val=data(2), resume=resume)


@pytest.mark.parametrize("node", [Recurrent, Pair])
def test_a_run_resumed_mid_epoch_goes_on_from_the_carried_state_bitwise(tmp_path, node):
    whole = carried_fit(tmp_path / "whole", node)
    with pytest.raises(Crash):
        carried_fit(tmp_path / "cut", node, [CrashAt(3)])  # last checkpoint: batch 2 of 5
    payload = st.load_checkpoint(st.Checkpointing(tmp_path / "cut").last())
    assert payload["position"] == 2 and len(payload["carry"][0]) == 1
    resumed = carried_fit(tmp_path / "cut", node, resume="last")
    assert resumed.losses == whole.losses
    assert resumed.metrics == whole.metrics
    assert all(torch.equal(v, resumed.state[k]) for k, v in whole.state.items())


class Odd(Recurrent):
    """Carries something a checkpoint cannot hold beside its state."""

    def forward(self, x, ctx):
        out, h = self.rnn(x, None if self.hidden.value is None else self.hidden.value[0])
        self.hidden.set((h, object()))
        return Done(Opaque(self.out(out[:, -1])))


def test_a_carried_value_a_checkpoint_cannot_hold_warns_on_a_mid_epoch_resume(tmp_path):
    with pytest.raises(Crash):
        carried_fit(tmp_path / "cut", Odd, [CrashAt(3)])
    with pytest.warns(UserWarning, match=r"type \['tuple'\] could not be checkpointed"):
        carried_fit(tmp_path / "cut", Odd, resume="last")


def test_micro_batches_with_carried_state_is_refused_naming_the_node():
    # each chunk would start from the previous chunk's state: silently not the whole batch
    torch.manual_seed(0)
    g = Graph.somatize(Recurrent().with_id("lm"))
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        micro_batches=2,
        options=st.Options(progress=False, shuffle=False),
    )
    before = {k: v.clone() for k, v in st.state(g).items()}
    with pytest.raises(
        SettingError, match=r"micro_batches=2 .*node 'lm' \(\.hidden\).*micro_batches=1"
    ):
        trainer.fit(g, data(4))
    assert all(torch.equal(before[k], v) for k, v in st.state(g).items())  # nothing trained


@pytest.mark.parametrize("form", ["list", "loader"])
def test_a_shuffled_training_order_with_carried_state_warns(form):
    from torch.utils.data import DataLoader, TensorDataset

    batches = data(4)
    shuffled = (
        batches
        if form == "list"
        else DataLoader(
            TensorDataset(torch.randn(8, 4, 3), torch.randint(0, 2, (8,))), 2, shuffle=True
        )
    )
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    with pytest.warns(UserWarning, match=r"st\.Carry in node 'recurrent' \(\.hidden\).*shuffle"):
        trainer.fit(Graph.somatize(Recurrent()), shuffled)
    in_order = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False, shuffle=False),
    )
    in_order.fit(Graph.somatize(Recurrent()), batches)  # no warning (warnings are errors here)


@pytest.mark.parametrize("shuffle", [False, True])
def test_under_ddp_carried_state_warns_that_a_rank_skips_the_batches_between(shuffle):
    """Each rank takes every world-th batch (a DataLoader's DistributedSampler, every
    world-th row): a rank's state goes from batch 0 to batch 2, skipping 1 (begin passes
    the world size; a torchrun launch is not needed to see what it is told)."""
    from somatize.torch.carry import check_carried, named_carries

    model = st.module(Graph.somatize(Recurrent().with_id("lm")))
    with pytest.warns(UserWarning) as said:
        check_carried(named_carries(model), 1, data(4), shuffle, world=2)
    (message,) = [str(w.message) for w in said]  # the DDP warning says it all: one
    assert "st.Carry in node 'lm' (.hidden)" in message
    assert "the 2 ranks take turns at the batches" in message
    assert "skips the other ranks' batches in between" in message
