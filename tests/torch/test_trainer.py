"""The Trainer against plain PyTorch: gradients, losses, weights, and every option."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.errors import CheckpointError
from somatize.watchers import EpochEnd, Metrics, StepEnd


class Linear(Node):
    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Tanh(Node):
    def forward(self, x, ctx):
        return Done(Opaque(torch.tanh(x)))


def make_graph(seed: int = 0) -> Graph:
    torch.manual_seed(seed)
    return Graph.somatize(Linear(4, 8) >> Tanh() >> Linear(8, 3))


def plain_copy(g: Graph) -> nn.Module:
    """The same network written by hand, with the graph's current weights."""
    return nn.Sequential(
        copy.deepcopy(g["linear"].lin), nn.Tanh(), copy.deepcopy(g["linear_2"].lin)
    )


def plain_state(m: nn.Module) -> dict[str, torch.Tensor]:
    names = {"0": "linear.lin", "2": "linear_2.lin"}
    return {f"{names[k.split('.')[0]]}.{k.split('.', 1)[1]}": v for k, v in m.state_dict().items()}


def batches(n: int = 6, size: int = 10, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 4, generator=gen), torch.randint(0, 3, (size,), generator=gen))
        for _ in range(n)
    ]


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def quiet(**kw) -> st.Options:
    return st.Options(progress=False, **kw)


class Capture(torch.optim.SGD):
    """lr 0: records every step's gradients and leaves the weights alone."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.0)
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() for p in self.param_groups[0]["params"]])


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


# -- options ---------------------------------------------------------------------------


def test_bf16_autocast_runs_and_trains():
    g = make_graph()
    dtypes = []
    g["linear"].lin.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=3e-2),
        epochs=15,
        options=quiet(precision="bf16"),
    )
    data = batches(2)
    result = trainer.fit(g, data, val=data)
    assert set(dtypes) == {torch.bfloat16}
    assert all(v.dtype == torch.float32 for v in result.state.values())  # the weights stay fp32
    assert result.metrics[-1]["val_loss"] < 0.7 * result.metrics[0]["val_loss"]


def test_gradient_clipping_clips_the_update():
    data = batches(1)
    updates = {}
    for clip in (None, 0.01):
        g = make_graph()
        before = torch.cat([p.detach().flatten().clone() for p in st.parameters(g)])
        trainer = st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=1.0),
            options=quiet(clip_grad_norm=clip),
        )
        trainer.fit(g, data)
        after = torch.cat([p.detach().flatten() for p in st.parameters(g)])
        updates[clip] = before - after
    assert updates[None].norm() > 0.1  # without clipping the step is much larger
    torch.testing.assert_close(updates[0.01].norm(), torch.tensor(0.01))
    torch.testing.assert_close(updates[0.01], updates[None] * 0.01 / updates[None].norm())


@pytest.mark.parametrize(
    ("every", "want"),
    [("step", [0.8, 0.4, 0.2, 0.1, 0.05, 0.025]), ("epoch", [0.8, 0.8, 0.8, 0.4, 0.4, 0.4])],
)
def test_scheduler_steps_per_step_or_per_epoch(every, want):
    rec = Recorder()
    made = []
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.8),
        scheduler=lambda opt: (
            made.append(torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)) or made[-1]
        ),
        epochs=2,
        watchers=[rec],
        options=quiet(scheduler_every=every),
    )
    trainer.fit(make_graph(), batches(3))
    assert [e.lr for e in rec.of(StepEnd)] == pytest.approx(want)  # the rate each step used
    assert made[0].get_last_lr()[0] == pytest.approx(want[-1] * 0.5)


def test_max_steps_stops_mid_epoch():
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, epochs=10, max_steps=8, options=quiet()
    )
    result = trainer.fit(make_graph(), batches(3), val=batches(1))
    assert (result.steps, result.epochs, len(result.losses)) == (8, 2, 8)
    assert [m["step"] for m in result.metrics] == [3, 6]  # epoch ends only

    unbounded = st.Trainer(loss=F.cross_entropy, optimizer=sgd, max_steps=7, options=quiet())
    assert unbounded.fit(make_graph(), batches(3)).steps == 7  # epochs run on until max_steps


def test_eval_every_steps():
    rec = Recorder()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=2,
        metrics={"acc": st.accuracy},
        watchers=[rec],
        options=quiet(eval_every_steps=2),
    )
    result = trainer.fit(make_graph(), batches(3), val=batches(2))
    assert [(m["step"], m["epoch"]) for m in result.metrics] == [(2, 0), (4, 1), (6, 1)]
    evals = [e for e in rec.of(Metrics) if e.node == ""]
    assert [e.step for e in evals] == [2, 4, 6]
    assert set(evals[0].values) == {"val_loss", "val_acc"}
    assert [e.metrics for e in rec.of(EpochEnd)] == [{}, {}]  # no evaluation at epoch ends
    assert result.best == min(m["val_loss"] for m in result.metrics)


def test_evaluate_weighs_batches_by_their_size():
    g = make_graph()
    data = batches(3, size=10) + batches(1, size=3, seed=5)
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, metrics={"acc": st.accuracy})
    got = trainer.evaluate(g, data)
    x = torch.cat([b[0] for b in data])
    y = torch.cat([b[1] for b in data])
    with torch.no_grad():
        out = plain_copy(g)(x)
    assert got["loss"] == pytest.approx(F.cross_entropy(out, y).item(), rel=1e-6)
    assert got["acc"] == pytest.approx(st.accuracy(out, y).item())
    assert st.module(g).training  # evaluation leaves the mode as it found it


def test_a_dataloader_trains_and_counts_its_dataset():
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=2, options=quiet())
    result = trainer.fit(make_graph(), loader)
    assert (result.steps, result.num_examples) == (14, 50)


def test_without_a_loss_the_graph_gets_the_whole_batch_and_outputs_the_loss():
    class MSE(Node):
        def forward(self, pair, ctx):
            out, y = pair
            return Done(Opaque(F.mse_loss(out, y)))

    class Model(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(4, 1)

        def forward(self, batch, ctx):
            x, y = batch
            return Done(Opaque((self.lin(x), y)))

    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(6, 4, generator=gen), torch.randn(6, 1, generator=gen)) for _ in range(4)]
    torch.manual_seed(0)
    g = Graph.somatize(Model() >> MSE())
    plain = copy.deepcopy(g["model"].lin)
    opts = quiet(shuffle=False)
    a = st.Trainer(optimizer=sgd, epochs=2, options=opts).fit(g, data, val=data)
    b = st.Trainer(loss=F.mse_loss, optimizer=sgd, epochs=2, options=opts).fit(
        plain, data, val=data
    )
    assert a.losses == b.losses
    assert a.metric("val_loss") == b.metric("val_loss")


def test_node_metrics_reach_watchers_and_nodes_see_the_step():
    steps = []

    class Head(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(8, 3)

        def forward(self, x, ctx):
            out = self.lin(x)
            if ctx.training:
                steps.append(ctx.step)
            return Done(Opaque(out), metrics={"mean": out.detach().mean()})

    torch.manual_seed(0)
    g = Graph.somatize(Linear(4, 8) >> Head())
    rec = Recorder()
    st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=2, watchers=[rec], options=quiet()).fit(
        g, batches(3)
    )
    node = [e for e in rec.of(Metrics) if e.node == "head"]
    assert [e.step for e in node] == [1, 2, 3, 4, 5, 6] == steps
    assert all(set(e.values) == {"mean"} for e in node)


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


# -- errors say what is wrong and what to do --------------------------------------------


def test_a_loss_that_is_not_a_scalar_is_refused():
    trainer = st.Trainer(
        loss=lambda out, y: F.cross_entropy(out, y, reduction="none"),
        optimizer=sgd,
        options=quiet(),
    )
    with pytest.raises(TypeError, match=r"scalar.*shape \(10,\).*mean"):
        trainer.fit(make_graph(), batches(1))


def test_an_all_frozen_graph_has_nothing_to_train():
    g = make_graph()
    for node in g.nodes():
        g.freeze(node)
    with pytest.raises(ValueError, match=r"nothing to train.*freeze"):
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet()).fit(g, batches(1))


def test_resume_last_needs_checkpointing():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet())
    with pytest.raises(CheckpointError, match=r"resume='last' needs checkpoint=Checkpointing"):
        trainer.fit(make_graph(), batches(1), resume="last")


def test_metric_that_is_not_a_scalar_is_refused():
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, metrics={"bad": lambda o, y: o}, options=quiet()
    )
    with pytest.raises(TypeError, match=r"'bad' must give one number.*\(10, 3\)"):
        trainer.fit(make_graph(), batches(1), val=batches(1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"optimizer": torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1)},
            TypeError,
            "factory",
        ),
        ({"optimizer": sgd, "micro_batches": 0}, ValueError, "micro_batches"),
        ({"optimizer": sgd, "epochs": 0}, ValueError, "epochs"),
        ({"optimizer": sgd, "pruner": object()}, TypeError, "should_prune"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        st.Trainer(**kwargs)


def test_bad_options_are_refused():
    with pytest.raises(
        ValueError, match="precision must be one of '32', 'bf16', 'fp16', not '16-mixed'"
    ):
        st.Options(precision="16-mixed")
    with pytest.raises(ValueError, match="scheduler_every"):
        st.Options(scheduler_every="batch")


def test_empty_training_data_is_an_error():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, max_steps=5, options=quiet())
    with pytest.raises(ValueError, match="no batches"):
        trainer.fit(make_graph(), [])


def test_a_pruner_without_validation_data_is_an_error():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, pruner=st.Patience(), options=quiet())
    with pytest.raises(ValueError, match="val="):
        trainer.fit(make_graph(), batches(1))


# -- metric-driven schedulers ------------------------------------------------------------


def test_reduce_lr_on_plateau_steps_with_the_monitored_metric_after_each_evaluation():
    made = []
    scores = iter([0.5, 0.4, 0.4, 0.4])

    def sched(opt):
        made.append(
            torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0)
        )
        return made[-1]

    rec = Recorder()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.8),
        scheduler=sched,
        epochs=4,
        metrics={"score": lambda out, y: torch.tensor(next(scores))},
        watchers=[rec],
        # a scripted metric: the sanity check's call would take a score too
        options=quiet(monitor="val_score", mode="max", sanity_val_batches=0),
    )
    trainer.fit(make_graph(), batches(2), val=batches(1))
    # epoch 1: 0.5 is the best so far; epoch 2: worse (patience 0) halves; then again twice
    assert [e.lr for e in rec.of(StepEnd)] == pytest.approx([0.8] * 4 + [0.4] * 2 + [0.2] * 2)
    assert made[0].optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_reduce_lr_on_plateau_needs_validation_data_and_a_known_metric():
    def plateau(opt):
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt)

    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, scheduler=plateau, options=quiet())
    with pytest.raises(ValueError, match="ReduceLROnPlateau .* no val= data"):
        trainer.fit(make_graph(), batches(1))
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, scheduler=plateau, options=quiet(monitor="val_nll")
    )
    with pytest.raises(KeyError, match="monitor='val_nll'"):
        trainer.fit(make_graph(), batches(1), val=batches(1))


def test_a_per_epoch_scheduler_steps_after_the_epochs_evaluation():
    seen = []

    class Spy(torch.optim.lr_scheduler.StepLR):
        def step(self, *a, **k):
            seen.append("sched")
            super().step(*a, **k)

    def metric(out, y):
        seen.append("eval")
        return torch.tensor(0.0)

    st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        scheduler=lambda opt: Spy(opt, 1),
        epochs=2,
        metrics={"m": metric},
        options=quiet(scheduler_every="epoch"),
    ).fit(make_graph(), batches(1), val=batches(1))
    assert seen[-4:] == ["eval", "sched", "eval", "sched"]


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
