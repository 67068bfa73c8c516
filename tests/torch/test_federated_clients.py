"""Client side: FedProx and SCAFFOLD against hand-written steps; map_clients; weighted metrics."""

import concurrent.futures
import pickle

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import AggregationError
from somatize.torch import federated as fl


class Linear(Node):
    def __init__(self, i, o):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def make_graph(seed=0):
    torch.manual_seed(seed)
    return Graph.somatize(Linear(4, 3))


GEN = torch.Generator().manual_seed(0)
BATCHES = [
    (torch.randn(8, 4, generator=GEN), torch.randint(0, 3, (8,), generator=GEN)) for _ in range(5)
]


def moved(model):
    """The model after the client moved away from the global weights (so the term matters)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3)
    return model


@pytest.mark.parametrize(
    "make_opt",
    [lambda ps: torch.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.Adam(ps, lr=0.05)],
    ids=["sgd", "adam"],
)
def test_prox_equals_a_hand_written_fedprox_loss(make_opt):
    mu = 0.5
    torch.manual_seed(0)
    ours, theirs = nn.Linear(4, 3), nn.Linear(4, 3)
    theirs.load_state_dict(ours.state_dict())
    anchor = [p.detach().clone() for p in theirs.parameters()]
    opt_ours = fl.prox(make_opt, mu=mu)(list(ours.parameters()))
    opt_theirs = make_opt(list(theirs.parameters()))
    moved(ours), moved(theirs)
    for x, y in BATCHES:
        opt_ours.zero_grad()
        nn.functional.cross_entropy(ours(x), y).backward()
        opt_ours.step()
        opt_theirs.zero_grad()  # FedProx as Li et al. write it: the proximal term in the loss
        prox_term = sum((p - a).pow(2).sum() for p, a in zip(theirs.parameters(), anchor))
        (nn.functional.cross_entropy(theirs(x), y) + mu / 2 * prox_term).backward()
        opt_theirs.step()
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)


CLOSURE_OPTIMIZERS = [
    lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=4),
    lambda ps: torch.optim.LBFGS(ps, lr=1, max_iter=4, line_search_fn="strong_wolfe"),
    lambda ps: torch.optim.SGD(ps, lr=0.1),  # as Lightning steps it: with a closure
]
CLOSURE_IDS = ["lbfgs", "lbfgs-wolfe", "sgd-closure"]


def _closure(model, opt, x, y, extra=lambda: 0.0):
    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) + extra()
        loss.backward()
        return loss

    return closure


@pytest.mark.parametrize("make_opt", CLOSURE_OPTIMIZERS, ids=CLOSURE_IDS)
def test_prox_with_a_closure_equals_a_hand_written_fedprox_loss(make_opt):
    # LBFGS evaluates the closure many times a step: the term must be in every evaluation
    mu = 0.5
    torch.manual_seed(0)
    ours, theirs = nn.Linear(4, 3), nn.Linear(4, 3)
    theirs.load_state_dict(ours.state_dict())
    anchor = [p.detach().clone() for p in theirs.parameters()]
    opt_ours = fl.prox(make_opt, mu=mu)(list(ours.parameters()))
    opt_theirs = make_opt(list(theirs.parameters()))
    moved(ours), moved(theirs)

    def prox_term():
        return mu / 2 * sum((p - a).pow(2).sum() for p, a in zip(theirs.parameters(), anchor))

    for x, y in BATCHES:
        got = opt_ours.step(_closure(ours, opt_ours, x, y))
        want = opt_theirs.step(_closure(theirs, opt_theirs, x, y, prox_term))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # the objective's loss
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make_opt", CLOSURE_OPTIMIZERS, ids=CLOSURE_IDS)
def test_scaffold_with_a_closure_equals_a_hand_written_linear_correction(make_opt):
    g = make_graph()
    ours = st.module(g)
    theirs = nn.Linear(4, 3)
    weight, bias = ours.parameters()
    theirs.load_state_dict({"weight": weight.detach(), "bias": bias.detach()})
    gen = torch.Generator().manual_seed(1)
    c = {n: 0.1 * torch.randn(p.shape, generator=gen) for n, p in ours.named_parameters()}
    ci = {n: 0.1 * torch.randn(p.shape, generator=gen) for n, p in ours.named_parameters()}
    d = [c[n] - ci[n] for n, _ in ours.named_parameters()]
    opt_ours = fl.scaffold(make_opt, g, c, ci)(list(ours.parameters()))
    opt_theirs = make_opt(list(theirs.parameters()))

    def l2(model):  # (the user's own: bounds the objective, which a linear term alone may
        return lambda: 0.5 * sum(p.pow(2).sum() for p in model.parameters())  # not be)

    def linear():  # ⟨c − cᵢ, w⟩: its gradient is SCAFFOLD's correction
        return l2(theirs)() + sum((di * p).sum() for di, p in zip(d, theirs.parameters()))

    for x, y in BATCHES:
        opt_ours.step(_closure(ours, opt_ours, x, y, l2(ours)))
        opt_theirs.step(_closure(theirs, opt_theirs, x, y, linear))
        for a, b in zip(ours.parameters(), theirs.parameters()):  # (the losses differ by a
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # constant, rounded)


def test_prox_in_the_trainer_pulls_the_client_towards_the_global_state():
    distance = {}
    for mu in (0.0, 1.0):
        g = make_graph()
        start = st.state(g)
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=fl.prox(lambda ps: torch.optim.SGD(ps, lr=0.5), mu=mu),
            epochs=5,
            seed=0,
            options=st.Options(progress=False),
        )
        end = trainer.fit(g, BATCHES).state
        distance[mu] = sum(float((end[k] - start[k]).norm()) for k in start)
    assert distance[1.0] < 0.8 * distance[0.0]
    with pytest.raises(ValueError, match="mu must be a non-negative"):
        fl.prox(lambda ps: torch.optim.SGD(ps, lr=0.1), mu=-1)


def test_scaffold_adds_c_minus_c_client_and_option_two_variates():
    lr = 0.1
    g, ref = make_graph(), nn.Linear(4, 3)
    ref.load_state_dict({k.split("lin.")[1]: v for k, v in st.state(g).items()})
    gen = torch.Generator().manual_seed(1)
    c = {k: torch.randn(v.shape, generator=gen) for k, v in fl.variates(g).items()}
    ci = {k: torch.randn(v.shape, generator=gen) for k, v in c.items()}
    start = st.state(g)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=fl.scaffold(lambda ps: torch.optim.SGD(ps, lr=lr), g, c, ci),
        epochs=1,
        seed=0,
        options=st.Options(progress=False, shuffle=False),
    )
    result = trainer.fit(g, BATCHES)
    corr = {"weight": c["linear.lin.weight"] - ci["linear.lin.weight"]}
    corr["bias"] = c["linear.lin.bias"] - ci["linear.lin.bias"]
    for x, y in BATCHES:  # SCAFFOLD's local step, by hand: y ← y − η (g(y) − cᵢ + c)
        ref.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                p -= lr * (p.grad + corr[name])
    for name, p in ref.named_parameters():
        torch.testing.assert_close(result.state[f"linear.lin.{name}"], p.detach())
    new = fl.control_variate(start, result, c, ci, lr=lr)
    k = "linear.lin.weight"
    expected = ci[k] - c[k] + (start[k] - result.state[k]) / (len(BATCHES) * lr)
    torch.testing.assert_close(new[k], expected)
    server = fl.server_variate(c, [{n: new[n] - ci[n] for n in c}], clients=4)
    torch.testing.assert_close(server[k], c[k] + (new[k] - ci[k]) / 4)
    with pytest.raises(AggregationError, match=r"no entry for \['linear.lin.bias'\]"):
        fl.scaffold(lambda ps: torch.optim.SGD(ps, lr=lr), g, {k: c[k]}, ci)


def test_weighted_metrics_weigh_by_examples_as_flower_does():
    def evaluated(train, val, metrics):
        return st.TrainResult(state={}, num_examples=train, steps=1, epochs=1,
                              metrics=[{"step": 1, **metrics}], val_examples={"val_": val})  # fmt: skip

    # weighed by the examples evaluated, not the training-set sizes (1000, 1)
    results = [
        evaluated(1000, 10, {"val_loss": 1.0}),
        evaluated(1, 30, {"val_loss": 2.0, "val_acc": 0.5}),
    ]
    out = fl.weighted_metrics(results)
    assert out == {"val_loss": pytest.approx(1.75), "val_acc": 0.5}
    flower = sum(n * v for n, v in [(10, 1.0), (30, 2.0)]) / 40  # flwr's weighted_loss_avg
    assert fl.weighted_metrics([(10, {"loss": 1.0}), (30, {"loss": 2.0})])["loss"] == flower
    with pytest.raises(AggregationError, match="client 1's 'loss' is NaN"):
        fl.weighted_metrics([(10, {"loss": 1.0}), (30, {"loss": float("nan")})])
    with pytest.raises(AggregationError, match="client 0 is a str"):
        fl.weighted_metrics(["x"])
    # a result that does not say (made by hand, by Lightning): its training-set size, and a warning
    bare = st.TrainResult(state={}, num_examples=30, steps=1, epochs=1, metrics=[{"val_loss": 2.0}])
    with pytest.warns(
        UserWarning, match=r"clients \[1\] do not say how many examples their 'val_loss'"
    ):
        assert fl.weighted_metrics([results[0], bare])["val_loss"] == pytest.approx(1.75)


def test_weighted_metrics_of_trained_clients_is_the_pooled_validation_metric():
    # train/val sizes (200, 10) and (10, 200): weighed by training size, the mean was 0.5007
    # where the pooled validation accuracy (and Flower's) is 0.5143
    gen = torch.Generator().manual_seed(0)

    def split(n):
        return [(torch.randn(10, 4, generator=gen), torch.randint(0, 3, (10,), generator=gen))
                for _ in range(n // 10)]  # fmt: skip

    trainer = st.Trainer(loss=torch.nn.functional.cross_entropy,
                         optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                         metrics={"acc": st.accuracy}, options=st.Options(progress=False))  # fmt: skip
    clients = [(split(200), split(10)), (split(10), split(200))]
    graphs = [Graph.somatize(Linear(4, 3)) for _ in clients]
    results = [trainer.fit(g, train, val=val) for g, (train, val) in zip(graphs, clients)]
    assert [r.val_examples for r in results] == [{"val_": 10}, {"val_": 200}]
    pooled = {
        k: sum(trainer.evaluate(g, val)[k] * 10 * len(val) for g, (_, val) in zip(graphs, clients))
        / 210
        for k in ("loss", "acc")
    }
    out = fl.weighted_metrics(results)
    assert out["val_acc"] == pytest.approx(pooled["acc"]) and out["val_loss"] == pytest.approx(
        pooled["loss"]
    )


def test_weighted_metrics_of_results_without_evaluation_point_to_val():
    unevaluated = [st.TrainResult(state={}, num_examples=n, steps=1, epochs=1) for n in (5, 7)]
    with pytest.raises(AggregationError, match=r"none of the 2 clients reports a metric.*val="):
        fl.weighted_metrics(unevaluated)  # a Trainer fitted without val=
    with pytest.raises(AggregationError, match="none of the 2 clients reports a metric"):
        fl.weighted_metrics([(3, {}), (4, {"step": 2, "epoch": 1})])  # only bookkeeping
    # one client that evaluated is enough: the metric is averaged over those that report it
    one = st.TrainResult(state={}, num_examples=1, steps=1, epochs=1, metrics=[{"val_loss": 4.0}],
                         val_examples={"val_": 3})  # fmt: skip
    assert fl.weighted_metrics([*unevaluated, one]) == {"val_loss": 4.0}


PICKLED, UNPICKLED = [], []


def _shared(value):
    UNPICKLED.append(value)
    return Shared(value)


class Shared:
    """A shared value that counts how often it is pickled and unpickled."""

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        PICKLED.append(1)
        return (_shared, (self.value,))


class PicklingPool(concurrent.futures.Executor):
    """An executor that pickles every call, as a process pool does, and runs it here."""

    _max_workers = 3

    def __init__(self):
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        fn, args = pickle.loads(pickle.dumps((fn, args)))
        f = concurrent.futures.Future()
        f.set_result(fn(*args, **kwargs))
        return f


def plus(shared, task):
    return shared.value + task


def test_map_clients_pickles_the_shared_value_once_and_returns_results_in_task_order():
    PICKLED.clear(), UNPICKLED.clear()
    tasks = list(range(100))
    pool = PicklingPool()
    out = fl.map_clients(pool, plus, tasks, shared=Shared(1000))
    assert out == [1000 + t for t in tasks]
    # a few batches per worker (balanced by the pool), the shared value pickled once and,
    # here where every batch runs in one process, unpickled once: not once per client task
    assert pool.calls == 3 * fl.clients._PER_WORKER
    assert len(PICKLED) == 1 and UNPICKLED == [1000]
    # the next round's value is unpickled afresh, not the last one reused
    assert fl.map_clients(pool, plus, tasks[:5], shared=Shared(2000)) == [
        2000 + t for t in tasks[:5]
    ]
    assert UNPICKLED == [1000, 2000]
    PICKLED.clear()
    sizes = [1] * 99 + [100]
    pool = PicklingPool()
    assert fl.map_clients(pool, plus, tasks, shared=Shared(0), batches=2, sizes=sizes) == tasks
    assert len(PICKLED) == 1 and pool.calls == 2
    assert fl.map_clients(None, plus, tasks, shared=Shared(5)) == [5 + t for t in tasks]
    with pytest.raises(ValueError, match="sizes for 100 tasks"):
        fl.map_clients(PicklingPool(), plus, tasks, shared=Shared(0), sizes=[1])
    with pytest.raises(ValueError, match="batches must be a positive int"):
        fl.map_clients(PicklingPool(), plus, tasks, shared=Shared(0), batches=0)


def fails_on_seven(shared, task):
    if task == 7:
        raise KeyError("client data missing")
    return task


@pytest.mark.parametrize("where", ["serial", "pickling", "threads"])
def test_an_exception_names_the_task_that_raised_it(where):
    threads = concurrent.futures.ThreadPoolExecutor(2)
    pool = {"serial": None, "pickling": PicklingPool(), "threads": threads}[where]
    with threads, pytest.raises(KeyError, match="client data missing") as info:
        fl.map_clients(pool, fails_on_seven, list(range(10)), shared=0, batches=3)
    assert info.value.__notes__ == [
        "map_clients: raised by fn(shared, tasks[7]); run that task with pool=None to debug it"
    ]


def fails_on_three_and_seven(shared, task):
    if task in (3, 7):
        raise KeyError(f"client {task}'s data missing")
    return {"w": torch.full((3,), float(task + shared))}


@pytest.mark.parametrize("where", ["serial", "pickling", "threads"])
def test_with_errors_return_a_failing_client_fills_its_slot_and_the_others_run(where):
    threads = concurrent.futures.ThreadPoolExecutor(2)
    pool = {"serial": None, "pickling": PicklingPool(), "threads": threads}[where]
    with threads:
        out = fl.map_clients(pool, fails_on_three_and_seven, list(range(10)), shared=1,
                             batches=3, errors="return")  # fmt: skip
    failed = [r for r in out if isinstance(r, fl.ClientFailure)]
    assert [f.index for f in failed] == [3, 7] and [out.index(f) for f in failed] == [3, 7]
    for f in failed:
        assert type(f.error) is KeyError and f"client {f.index}'s data missing" in str(f.error)
        assert f.error.__notes__ == [
            f"map_clients: raised by fn(shared, tasks[{f.index}]); run that task with pool=None "
            "to debug it"
        ]
        assert "in fails_on_three_and_seven" in f.traceback and "KeyError" in f.traceback
        assert repr(f).startswith(f"ClientFailure(tasks[{f.index}]: KeyError(")
    ok = [r for r in out if not isinstance(r, fl.ClientFailure)]
    assert [float(r["w"][0]) for r in ok] == [1, 2, 3, 5, 6, 7, 9, 10]
    with pytest.raises(ValueError, match=r"errors must be 'raise'.*'return'.*not 'skip'"):
        fl.map_clients(pool, fails_on_three_and_seven, [1], errors="skip")


def test_aggregators_refuse_a_failure_and_say_how_to_drop_it():
    out = fl.map_clients(None, fails_on_three_and_seven, list(range(5)), shared=0,
                         errors="return")  # fmt: skip
    idiom = r"results = \[r for r in results if not isinstance\(r, fl.ClientFailure\)\]"
    for aggregate in (
        lambda rs: st.fedavg(rs, weights="uniform"),
        fl.fedmedian,
        lambda rs: fl.clip(rs, {"w": torch.zeros(3)}, max_norm=1.0),
        lambda rs: fl.weighted_metrics(
            [r if isinstance(r, fl.ClientFailure) else (1, {"a": 1.0}) for r in rs]
        ),
    ):
        with pytest.raises(AggregationError, match=r"client 3 did not train.*tasks\[3\] raised "
                           r"KeyError.*" + idiom):  # fmt: skip
            aggregate(out)
    ok = [r for r in out if not isinstance(r, fl.ClientFailure)]  # the idiom
    mean = st.fedavg(ok, weights="uniform")["w"]
    assert torch.equal(mean, torch.full((3,), (0 + 1 + 2 + 4) / 4))


def test_map_clients_batches_taper_so_the_workers_finish_together():
    from somatize.torch.federated.clients import _TAIL, _batches, _shares

    groups = _batches(1000, _shares(8, 2), None)
    lengths = [len(g) for g in groups]
    assert sorted(i for g in groups for i in g) == list(range(1000))  # each task once
    assert lengths == sorted(lengths, reverse=True) and len(lengths) == 8
    assert lengths[-1] == pytest.approx(lengths[0] * _TAIL, rel=0.1)
    assert all(g[0] < 50 and g[-1] > 950 for g in groups)  # each spans the task list
    # one batch per worker (or fewer): equal shares
    assert [len(g) for g in _batches(100, _shares(2, 2), None)] == [50, 50]
    # by sizes: the largest tasks first, and no batch left empty
    sizes = [1.0] * 99 + [100.0]
    assert _batches(100, _shares(2, 2), sizes) == [[99], list(range(99))]
    assert _batches(3, _shares(8, 2), [3, 2, 1]) == [[0], [1], [2]]
    # one batch per worker: the longest tasks first, each where it finishes soonest
    assert _batches(6, _shares(2, 2), [10, 9, 8, 1, 1, 1]) == [[0, 3, 4, 5], [1, 2]]
    tapered = _batches(200, _shares(8, 2), [1.0 + i % 7 for i in range(200)])
    loads = [sum(1.0 + i % 7 for i in g) for g in tapered]
    assert loads == sorted(loads, reverse=True) and loads[-1] < loads[0] / 4


def test_map_clients_sends_a_large_shared_value_in_fewer_batches():
    # the shared value's bytes travel with every batch: past _SHIPPED per round, fewer batches
    assert fl.clients._default_batches(2, 1000, 1 << 10) == 2 * fl.clients._PER_WORKER
    assert fl.clients._default_batches(2, 1000, fl.clients._SHIPPED // 2) == 2
    assert fl.clients._default_batches(2, 1000, fl.clients._SHIPPED * 4) == 2  # one each
    assert fl.clients._default_batches(8, 3, 1) == 3  # never more batches than tasks


# map_clients on st.executor and on Dask, bitwise against the serial round: test_federated_recipes.py
