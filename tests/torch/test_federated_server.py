"""Server optimizers against float64 references written from Reddi et al.'s rules; an exact resume."""

import copy
import pickle

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import AggregationError
from somatize.torch import federated as fl


def states(seed, rounds=4):
    g = torch.Generator().manual_seed(seed)
    x = {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g)}
    aggs = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in x.items()}]
    for _ in range(rounds - 1):
        aggs.append({k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in aggs[-1].items()})
    return x, aggs


def reference(rule, x, aggs, lr, b1, b2, tau):
    """Reddi et al. 2021, Algorithm 2 (and Hsu et al. 2019 for FedAvgM), in float64."""
    x = {k: v.double() for k, v in x.items()}
    m = {k: torch.zeros_like(v) for k, v in x.items()}
    v = {k: torch.full_like(t, tau**2) for k, t in x.items()}
    out = []
    for agg in aggs:
        new = {}
        for k in x:
            d = agg[k].double() - x[k]
            if rule == "avgm":
                m[k] = b1 * m[k] + d
                new[k] = x[k] + lr * m[k]
                continue
            m[k] = b1 * m[k] + (1 - b1) * d
            if rule == "adagrad":
                v[k] = v[k] + d**2
            elif rule == "yogi":
                v[k] = v[k] - (1 - b2) * d**2 * torch.sign(v[k] - d**2)
            else:
                v[k] = b2 * v[k] + (1 - b2) * d**2
            new[k] = x[k] + lr * m[k] / (v[k].sqrt() + tau)
        x = {k: t.float().double() for k, t in new.items()}  # the global state is float32
        out.append(new)
    return out


CASES = {
    "avgm": (lambda: fl.FedAvgM(lr=0.7, momentum=0.9), 0.7, 0.9, 0.0, 0.0),
    "adam": (lambda: fl.FedAdam(lr=0.05, tau=1e-2), 0.05, 0.9, 0.99, 1e-2),
    "yogi": (lambda: fl.FedYogi(lr=0.05, beta2=0.9, tau=1e-3), 0.05, 0.9, 0.9, 1e-3),
    "adagrad": (lambda: fl.FedAdagrad(lr=0.1, tau=1e-3), 0.1, 0.0, 0.0, 1e-3),
}


@pytest.mark.parametrize("rule", CASES)
def test_server_optimizers_follow_the_papers_rule_in_float64(rule):
    make, lr, b1, b2, tau = CASES[rule]
    x, aggs = states(0)
    server = make()
    refs = reference(rule, x, aggs, lr, b1, b2, tau)
    for agg, ref in zip(aggs, refs):
        x = server.step(x, agg)
        for k in x:
            assert x[k].dtype == torch.float32
            torch.testing.assert_close(x[k], ref[k].float(), atol=1e-6, rtol=0)
    assert server.steps == len(aggs)


def test_fedavgm_without_momentum_at_lr_1_is_fedavg():
    x, aggs = states(1, rounds=1)
    out = fl.FedAvgM(lr=1.0, momentum=0.0).step(x, aggs[0])
    assert all(torch.equal(out[k], aggs[0][k]) for k in x)


def test_server_state_dict_resumes_exactly_and_integer_buffers_pass_through():
    x, aggs = states(2, rounds=4)
    x["count"] = torch.tensor(3)
    aggs = [{**a, "count": torch.tensor(3 + i)} for i, a in enumerate(aggs)]
    a, b = fl.FedYogi(lr=0.1), fl.FedYogi(lr=0.1)
    xa = xb = x
    for agg in aggs[:2]:
        xa = a.step(xa, agg)
    xb = xa
    b.load_state_dict(a.state_dict())
    for agg in aggs[2:]:
        xa, xb = a.step(xa, agg), b.step(xb, agg)
    assert all(torch.equal(xa[k], xb[k]) for k in xa) and xa["count"].item() == 6
    with pytest.raises(ValueError, match=r"'yogi' server optimizer, not 'adam'; .*fl\.FedYogi"):
        fl.FedAdam().load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match=r"missing \['m', 'rule', 'steps', 'v'\]; pass what"):
        fl.FedAdam().load_state_dict({})


def test_server_step_errors_name_the_key():
    x, aggs = states(3, rounds=1)
    with pytest.raises(AggregationError, match=r"differ in keys \['b'\]"):
        fl.FedAdam().step(x, {"w": aggs[0]["w"]})
    with pytest.raises(AggregationError, match="key 'b'.*float64"):
        fl.FedAdam().step(x, {**aggs[0], "b": aggs[0]["b"].double()})
    for make in (fl.FedAdam, fl.FedAvgM):  # moments of another model: named, with the fix
        server = make()
        server.step({"w": torch.zeros(3)}, {"w": torch.ones(3)})
        fix = rf"key 'w' is \(2,\) now.*made for \(3,\).*fresh one \(fl.{make.__name__}\(...\)\)"
        with pytest.raises(AggregationError, match=fix):
            server.step({"w": torch.zeros(2)}, {"w": torch.ones(2)})
    with pytest.raises(ValueError, match="lr must be a positive"):
        fl.FedAdam(lr=0)
    with pytest.raises(ValueError, match=r"beta2 must be in \[0, 1\)"):
        fl.FedYogi(beta2=1.0)


def test_server_step_says_what_to_pass_when_given_results():
    x, aggs = states(3, rounds=1)
    results = [st.TrainResult(state=aggs[0], num_examples=4, steps=1, epochs=1)]
    fix = r"pass the global state dict and st\.fedavg\(results\)"
    with pytest.raises(TypeError, match=rf"aggregate is a list \(the clients' results\?\).*{fix}"):
        fl.FedAdam().step(x, results)
    with pytest.raises(TypeError, match=rf"aggregate is a TrainResult.*\.state.*{fix}"):
        fl.FedAdam().step(x, results[0])
    with pytest.raises(TypeError, match=rf"global_state is a TrainResult.*{fix}"):
        fl.FedAdam().step(results[0], aggs[0])
    with pytest.raises(TypeError, match=rf"aggregate\['b'\] is a list, not a tensor.*{fix}"):
        fl.FedAdam().step(x, {**aggs[0], "b": [0.0, 1.0, 2.0]})
    server = fl.FedAdam()
    with pytest.raises(TypeError):
        server.step(x, results)
    assert server.steps == 0 and not server.m  # refused before any update


def test_server_state_dict_saves_the_hyper_parameters_and_a_changed_one_warns(tmp_path):
    x, aggs = states(4, rounds=3)
    a = fl.FedAdam(lr=0.05, beta2=0.9, tau=1e-2)
    xa = a.step(x, aggs[0])
    torch.save(a.state_dict(), tmp_path / "server.pt")
    saved = torch.load(tmp_path / "server.pt", weights_only=True)
    assert (saved["lr"], saved["beta1"], saved["beta2"], saved["tau"]) == (0.05, 0.9, 0.9, 1e-2)
    same = fl.FedAdam(lr=0.05, beta2=0.9, tau=1e-2)
    same.load_state_dict(saved)  # nothing differs: no warning (warnings are errors here)
    b = fl.FedAdam(lr=0.5)  # a different lr and beta2 and tau: each named, the saved kept
    with pytest.warns(UserWarning) as record:
        b.load_state_dict(saved)
    messages = [str(w.message) for w in record]
    assert len(messages) == 3
    assert "'lr' changed: the checkpoint has 0.05, this 'adam' optimizer 0.5" in messages[0]
    assert "set server.lr = 0.5 after load_state_dict" in messages[0]
    assert "'beta2'" in messages[1] and "'tau'" in messages[2]
    assert (b.lr, b.beta2, b.tau) == (0.05, 0.9, 1e-2)
    xs, xb = a.step(xa, aggs[1]), b.step(xa, aggs[1])
    assert all(torch.equal(xs[k], xb[k]) for k in xs)  # resumed exactly
    fl.FedAvgM().load_state_dict({**fl.FedAvgM().state_dict(), "tau": 5.0})  # not FedAvgM's
    with pytest.warns(UserWarning, match="'momentum' changed: the checkpoint has 0.9"):
        fl.FedAvgM(momentum=0.0).load_state_dict(fl.FedAvgM().state_dict())
    old = {k: v for k, v in saved.items() if k not in ("lr", "beta1", "beta2", "tau")}
    c = fl.FedAdam(lr=0.5)
    c.load_state_dict(old)  # saved before the hyper-parameters were: this one's are used
    assert c.lr == 0.5 and c.steps == 1
    with pytest.raises(ValueError, match="checkpoint's server optimizer state is invalid: lr"):
        c.load_state_dict({**saved, "lr": -1.0})
    assert c.lr == 0.5


class Linear(Node):
    def __init__(self, i, o):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def make_graph():
    torch.manual_seed(0)
    return Graph.somatize(Linear(4, 3))


DATA = torch.Generator().manual_seed(0)
X, Y = torch.randn(60, 4, generator=DATA), torch.randint(0, 3, (60,), generator=DATA)
PARTS = fl.dirichlet(Y, clients=6, alpha=0.5, seed=0)


def train_client(global_state, task):
    part, seed = task
    g = make_graph()
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=fl.prox(lambda ps: torch.optim.SGD(ps, lr=0.1), mu=0.1),
        epochs=1,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, [(X[part], Y[part])])


def rounds(start, stop, global_state, server, gen):
    for r in range(start, stop):
        chosen = fl.sample(len(PARTS), count=3, round=r, seed=0)
        seeds = torch.randint(0, 2**31, (len(chosen),), generator=gen).tolist()
        tasks = [(PARTS[c], s) for c, s in zip(chosen, seeds)]
        results = fl.map_clients(None, train_client, tasks, shared=global_state)
        global_state = server.step(global_state, st.fedavg(results))
    return global_state


def test_a_round_loop_resumed_from_a_checkpoint_is_bitwise_equal(tmp_path):
    start = st.state(make_graph())
    whole = rounds(0, 4, start, fl.FedAdam(lr=0.05), torch.Generator().manual_seed(7))

    server, gen = fl.FedAdam(lr=0.05), torch.Generator().manual_seed(7)
    half = rounds(0, 2, start, server, gen)
    path = tmp_path / "round.pt"
    torch.save(
        {"global": half, "server": server.state_dict(), "round": 2, "rng": gen.get_state()}, path
    )
    del server, gen, half
    ckpt = torch.load(path, weights_only=True)
    server, gen = fl.FedAdam(lr=0.05), torch.Generator()
    server.load_state_dict(ckpt["server"])
    gen.set_state(ckpt["rng"])
    resumed = rounds(ckpt["round"], 4, ckpt["global"], server, gen)
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert not all(torch.equal(whole[k], start[k]) for k in whole)  # it did train


def test_buffers_named_are_taken_from_the_aggregate_and_statistics_left_unnamed_are_warned():
    import warnings as w

    from torch import nn

    from somatize.errors import AggregationError
    from somatize.torch import federated as fl

    bn = nn.BatchNorm1d(3)
    glob = {k: v.clone() for k, v in bn.state_dict().items()}
    agg = {k: (v + 5.0 if v.is_floating_point() else v + 1) for k, v in glob.items()}
    buffers = [k for k, _ in bn.named_buffers()]
    server = fl.FedAdam(lr=0.1, buffers=buffers)
    with w.catch_warnings():
        w.simplefilter("error")  # named: nothing to warn about
        out = server.step(glob, agg)
    for k in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(out[k], agg[k])  # averages and counters, as aggregated
    assert torch.allclose(out["weight"], glob["weight"] + 0.1, atol=1e-3)  # a first Adam step: ≈ lr
    unnamed = fl.FedAdam(lr=0.1)
    with pytest.warns(UserWarning, match=r"'running_mean'.*BatchNorm running statistics.*buffers="):
        moved = unnamed.step(glob, agg)
    assert not torch.equal(moved["running_var"], agg["running_var"])  # moved as a weight
    with pytest.raises(AggregationError, match=r"buffers names keys the state does not hold"):
        fl.FedAdam(buffers=["bn.running_mean"]).step(glob, agg)


@pytest.mark.parametrize("make", [fl.FedAdam, fl.FedAvgM], ids=["adam", "avgm"])
def test_a_refused_server_step_changes_nothing(make):
    """Found by an outside audit: the keys before the bad one had moved their moments, so
    the step retried once the state was fixed applied theirs twice."""
    server = make(lr=0.1)
    x = {"a": torch.zeros(3), "b": torch.zeros(2)}
    x = server.step(x, {"a": torch.ones(3), "b": torch.ones(2)})
    before = copy.deepcopy(server.state_dict())
    with pytest.raises(AggregationError, match="key 'b'"):
        server.step(x, {"a": torch.ones(3) * 2, "b": torch.ones(2, dtype=torch.float64)})
    after = server.state_dict()
    assert after["steps"] == before["steps"] == 1
    for table in ("m", "v"):
        assert after[table].keys() == before[table].keys()
        assert all(torch.equal(after[table][k], before[table][k]) for k in before[table])


@pytest.mark.parametrize("make", [fl.FedAdam, fl.FedYogi, fl.FedAdagrad, fl.FedAvgM])
def test_a_nan_or_inf_aggregate_is_refused_before_it_reaches_the_moments(make):
    """It was stepped: NaN in the state and in the moments m/v of every later round."""
    server = make(lr=0.1, buffers=["stat"])
    x = {"a": torch.zeros(3), "b": torch.zeros(2), "stat": torch.ones(2)}
    x = server.step(x, {"a": torch.ones(3), "b": torch.ones(2), "stat": torch.ones(2)})
    before = copy.deepcopy(server.state_dict())
    for key, bad in (("b", float("nan")), ("a", float("inf")), ("stat", float("nan"))):
        aggregate = {"a": torch.ones(3) * 2, "b": torch.ones(2) * 2, "stat": torch.ones(2)}
        aggregate[key][1] = bad
        with pytest.raises(AggregationError) as e:
            server.step(x, aggregate)
        assert str(e.value).startswith(f"key '{key}': the aggregate holds NaN or inf")
        assert "nothing was stepped" in str(e.value) and "nonfinite='skip'" in str(e.value)
    with pytest.raises(AggregationError, match="key 'a': the global state holds NaN"):
        server.step({**x, "a": torch.full((3,), float("nan"))}, {**x})
    after = server.state_dict()
    assert after["steps"] == 1 and after["m"].keys() == before["m"].keys()
    for table in ("m", "v"):
        assert all(torch.equal(after[table][k], before[table][k]) for k in before[table])


@pytest.mark.parametrize("make", [fl.FedAdam, fl.FedAvgM], ids=["adam", "avgm"])
def test_swapped_arguments_are_refused_with_the_order_and_the_fix(make):
    """Found by an outside audit: step(st.fedavg(results), global_state) was accepted and
    stepped backwards (FedAvgM lr=1 momentum=0 gave back the old global state)."""
    x = {"w": torch.zeros(4)}
    agg = st.fedavg([{"w": torch.ones(4)}, {"w": torch.ones(4)}], weights="uniform")
    server = make(lr=0.1)
    order = r"the order is step\(global_state, aggregate\).*server\.step\(global_state, st\.fedavg"
    with pytest.raises(TypeError, match=order):
        server.step(agg, x)
    crossed = pickle.loads(pickle.dumps(agg))  # (an OrderedDict with .weights, as torch.load gives)
    with pytest.raises(TypeError, match=order):
        server.step(crossed, x)
    assert server.steps == 0 and not server.m  # refused before any update
    assert float(server.step(x, agg)["w"][0]) > 0  # the right order moves toward the clients
    # a global state that is itself an earlier round's aggregate steps as before
    again = make(lr=0.1)
    assert torch.equal(again.step(agg, agg)["w"], agg["w"])
    assert float(make(lr=0.1).step(dict(agg), x)["w"][0]) < 1  # the message's way out


def test_fedavgm_momentum_is_named_momentum():
    """FedAvgM takes ``momentum=``: its errors and warnings say momentum, not the internal
    beta1, and ``server.momentum = 0.5`` sets what the rule uses — as ``server.lr = ...``
    does — rather than adding an attribute the rule never reads (the update went on at 0.9)."""
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\), not 1.5"):
        fl.FedAvgM(momentum=1.5)
    x, aggs = states(3)
    changed, fresh = fl.FedAvgM(lr=0.7), fl.FedAvgM(lr=0.7, momentum=0.5)
    assert changed.momentum == 0.9
    changed.momentum = 0.5
    assert changed.momentum == 0.5
    a, b = x, x
    for agg in aggs:
        a, b = changed.step(a, agg), fresh.step(b, agg)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ref = reference("avgm", x, aggs, 0.7, 0.5, 0.0, 0.0)[-1]
    assert all(torch.allclose(a[k].double(), ref[k]) for k in a)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\), not 1.0"):
        changed.momentum = 1.0
    assert changed.momentum == 0.5
    with pytest.warns(UserWarning, match="'momentum' changed: the checkpoint has 0.9") as w:
        fl.FedAvgM(momentum=0.0).load_state_dict(fl.FedAvgM().state_dict())
    assert "set server.momentum = 0.0 after load_state_dict" in str(w[0].message)
    with pytest.raises(ValueError, match="invalid: momentum must be in"):
        fl.FedAvgM().load_state_dict({**fl.FedAvgM().state_dict(), "beta1": 2.0})
    with pytest.raises(AttributeError, match="FedAdam has no momentum.*beta1"):
        fl.FedAdam().momentum = 0.5
    with pytest.raises(AttributeError, match="FedAdam has no momentum.*beta1"):
        fl.FedAdam().momentum  # noqa: B018


def test_a_server_optimizer_shows_the_hyper_parameters_its_rule_reads():
    """Found by a student's walkthrough: FedAvgM's repr showed FedAdam's beta2 and tau, which
    it never reads, and its momentum as beta1."""
    assert repr(fl.FedAvgM(momentum=0.5)) == "fl.FedAvgM(lr=1.0, momentum=0.5, steps=0)"
    assert repr(fl.FedAdagrad(exclude=["bn.*"])) == (
        "fl.FedAdagrad(lr=0.01, beta1=0.0, tau=0.001, steps=0, exclude=('bn.*',))"
    )
    assert "beta2=0.99, tau=0.001" in repr(fl.FedYogi())
