"""The Trainer against plain PyTorch: micro-batches, a plain training loop (bitwise), the
fast path against the general one, and the TrainResult it returns."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from tests.torch.trainer_helpers import (
    Capture,
    batches,
    make_graph,
    plain_copy,
    plain_state,
    quiet,
    sgd,
)

# -- micro-batches ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 4, 16])
def test_micro_batch_gradient_equals_full_batch_gradient(k):
    g = make_graph()
    plain = plain_copy(g)
    x, y = batches(1, size=10)[0]  # 10 rows: k=3 gives 4+4+2, k=4 gives 3+3+3+1, k=16 ten of 1
    F.cross_entropy(plain(x), y).backward()
    expected = [p.grad for p in plain.parameters()]

    made: list[Capture] = []
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: made.append(Capture(ps)) or made[-1],
        micro_batches=k,
        options=quiet(shuffle=False),
    )
    result = trainer.fit(g, [(x, y)])
    assert len(made[0].grads) == 1
    for got, want in zip(made[0].grads[0], expected, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        torch.tensor(result.losses[0]), F.cross_entropy(plain(x), y).detach()
    )


def test_micro_batches_with_nested_batches_split_every_leaf_alike():
    x = {"a": torch.arange(10), "b": (torch.arange(10) * 2, torch.arange(20).view(10, 2))}
    parts = st.batches.chunk(x, 4)
    assert [len(p["a"]) for p in parts] == [3, 3, 3, 1]
    for p in parts:
        assert torch.equal(p["b"][0], p["a"] * 2)
        assert torch.equal(p["b"][1][:, 0], p["a"] * 2)


def test_micro_batch_training_tracks_full_batch_training():
    results = []
    for k in (1, 3):
        g = make_graph()
        trainer = st.Trainer(
            loss=F.cross_entropy, optimizer=sgd, epochs=2, micro_batches=k, options=quiet()
        )
        results.append(trainer.fit(g, batches()))
    torch.testing.assert_close(torch.tensor(results[0].losses), torch.tensor(results[1].losses))
    for name, value in results[0].state.items():
        torch.testing.assert_close(results[1].state[name], value)


# -- differential: the Trainer is a plain PyTorch loop -------------------------------------


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
    ],
    ids=["sgd", "adam"],
)
def test_trainer_equals_a_plain_pytorch_loop(optimizer):
    g = make_graph()
    plain = plain_copy(g)
    data = batches()

    opt = optimizer(list(plain.parameters()))
    losses = []
    for _ in range(3):
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(plain(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=optimizer, epochs=3, options=quiet(shuffle=False)
    )
    result = trainer.fit(g, data)
    assert result.losses == losses  # bitwise: the same ops in the same order
    want = plain_state(plain)
    assert result.state.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(result.state[name], value), name
    assert (result.steps, result.epochs, result.num_examples) == (18, 3, 60)


def test_a_plain_nn_module_trains_too():
    g = make_graph()
    plain = plain_copy(g)
    twin = copy.deepcopy(plain)
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet(shuffle=False))
    a = trainer.fit(plain, batches())
    b = trainer.fit(g, batches())
    assert a.losses == b.losses
    assert not torch.equal(next(plain.parameters()), next(twin.parameters()))


def test_shuffle_is_seeded_per_epoch():
    def order(seed):
        seen: list[int] = []

        class Spy(Node):
            def __init__(self) -> None:
                self.lin = nn.Linear(1, 1)

            def forward(self, x, ctx):
                seen.append(int(x[0, 0]))
                return Done(Opaque(self.lin(x).mean()))

        data = [torch.full((2, 1), float(i)) for i in range(8)]
        st.Trainer(optimizer=sgd, epochs=2, seed=seed, options=quiet()).fit(
            Graph.somatize(Spy()), data
        )
        return seen

    a, b = order(0), order(1)
    assert a == order(0)  # the same seed, the same order
    assert a != b
    assert sorted(a[:8]) == sorted(a[8:]) == list(range(8))  # each epoch is a permutation
    assert a[:8] != a[8:]  # reshuffled each epoch


# -- the result ---------------------------------------------------------------------------


def test_train_result_pickles_and_is_small():
    g = make_graph()
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=torch.optim.Adam, epochs=2, options=quiet()
    )
    result = trainer.fit(g, batches(), val=batches(2))
    blob = pickle.dumps(result)
    back = pickle.loads(blob)
    assert back.state.keys() == result.state.keys()
    assert all(torch.equal(back.state[k], v) for k, v in result.state.items())
    assert (back.losses, back.metrics, back.steps, back.best) == (
        result.losses,
        result.metrics,
        result.steps,
        result.best,
    )
    weights = sum(v.numel() * v.element_size() for v in result.state.values())
    assert len(blob) < weights + 8_000  # the state, a little history, no optimizer or model
    assert all(not v.requires_grad and v.device.type == "cpu" for v in result.state.values())
    # the result is a copy: training the graph further does not change it
    before = {k: v.clone() for k, v in result.state.items()}
    trainer.fit(g, batches())
    assert all(torch.equal(before[k], v) for k, v in result.state.items())
    assert result.metric("val_loss") == result.metrics[-1]["val_loss"]
    with pytest.raises(KeyError, match=r"val_acc.*val_loss"):
        result.metric("val_acc")
    assert "12 steps" in repr(result)


class Silent:
    def on_event(self, event) -> None:
        pass


@pytest.mark.parametrize("kw", [{}, {"clip_grad_norm": 0.05, "eval_every_steps": 2}])
def test_the_fast_path_equals_the_general_one(tmp_path, kw):
    """Without watchers the Trainer takes an inlined loop; a watcher takes the general one."""
    results = []
    for i, watchers in enumerate(([], [Silent()])):
        torch.manual_seed(0)
        results.append(
            st.Trainer(
                loss=F.cross_entropy,
                optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
                scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5),
                epochs=2,
                metrics={"acc": st.accuracy},
                checkpoint=st.Checkpointing(tmp_path / str(i), every_steps=3, best=1),
                watchers=watchers,
                options=quiet(**kw),
            ).fit(make_graph(), batches(5), val=batches(2))
        )
    fast, general = results
    assert fast.losses == general.losses and fast.metrics == general.metrics
    assert fast.best_checkpoint.endswith(general.best_checkpoint[-20:])
    for k, v in fast.state.items():
        assert torch.equal(v, general.state[k])


def test_nodes_see_the_step_on_the_fast_path_too():
    seen = []

    class Spy(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(4, 3)

        def forward(self, x, ctx):
            seen.append(ctx.step)
            return Done(Opaque(self.lin(x)))

    st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=2, options=quiet()).fit(
        Graph.somatize(Spy()), batches(3)
    )
    assert seen == [1, 2, 3, 4, 5, 6]


def test_the_fast_path_honours_module_hooks_and_a_custom_zero_grad():
    g = make_graph()
    calls = []
    m = st.module(g)  # kept: module(g) is one per graph while it lives
    handle = m.register_forward_hook(lambda m, args, out: calls.append("hook"))

    class Zeroing(torch.optim.SGD):
        def zero_grad(self, set_to_none=True):
            calls.append("zero")
            super().zero_grad(set_to_none)

    try:
        st.Trainer(
            loss=F.cross_entropy, optimizer=lambda ps: Zeroing(ps, lr=0.1), options=quiet()
        ).fit(g, batches(3))
    finally:
        handle.remove()
    assert calls == ["zero", "hook"] * 3


def test_a_modules_extra_state_that_is_no_tensor_is_copied_into_the_result():
    # before: fit() crashed building TrainResult.state ('dict' has no 'requires_grad')
    class Noted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.note = nn.Linear(3, 2), {"vocab": ["a", "b"]}

        def forward(self, x):
            return self.lin(x)

        def get_extra_state(self):
            return self.note

        def set_extra_state(self, state):
            self.note = state

    model = Noted()
    batches = [(torch.randn(4, 3), torch.randint(0, 2, (4,)))] * 2
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=1,
        options=st.Options(progress=False),
    ).fit(model, batches)
    assert result.state["_extra_state"] == {"vocab": ["a", "b"]}
    assert result.state["_extra_state"] is not model.note  # a copy: no live object
    assert torch.equal(result.state["lin.weight"], model.lin.weight.detach())
