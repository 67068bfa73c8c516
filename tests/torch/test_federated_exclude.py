"""exclude= (FedBN: keys kept on the clients) across fedavg, the robust rules, clipping, server
optimizers and DP-FedAvg: against hand-written computations on the shared keys."""

import io
import pickle
import warnings

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import AggregationError
from somatize.torch import federated as fl

SHARED = ("enc.weight", "enc.bias", "head.weight")
LOCAL = ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


def client(seed, wild=1.0):
    """A state whose BatchNorm keys are ``wild`` times further out than its weights."""
    g = torch.Generator().manual_seed(seed)
    s = {
        "enc.weight": torch.randn(4, 3, generator=g),
        "enc.bias": torch.randn(4, generator=g),
        "head.weight": torch.randn(2, 4, generator=g),
    }
    for k in LOCAL[:-1]:
        s[k] = wild * torch.randn(4, generator=g)
    s["bn.num_batches_tracked"] = torch.tensor(seed)
    return s


def results(n=5, sizes=(3, 10, 7, 1, 4)):
    return [st.TrainResult(state=client(i), num_examples=m, steps=1, epochs=1)
            for i, m in zip(range(n), sizes)]  # fmt: skip


def test_fedavg_averages_only_the_shared_keys_and_says_which_it_kept_out():
    rs = results()
    out = st.fedavg(rs, exclude=list(LOCAL))
    sizes = [r.num_examples for r in rs]
    assert list(out) == list(SHARED) and out.excluded == tuple(sorted(LOCAL))
    for k in SHARED:  # a hand-written weighted mean
        mean = sum(r.state[k].double() * n for r, n in zip(rs, sizes)) / sum(sizes)
        torch.testing.assert_close(out[k].double(), mean, atol=1e-6, rtol=0)
        assert torch.equal(out[k], st.fedavg(rs, int_buffers="max")[k])  # bits as without
    # names, patterns and a predicate say the same; pickling keeps .excluded
    for rule in (["bn.*"], ["*.running_*", "bn.weight", "bn.bias", "*tracked"],
                 lambda k: k.startswith("bn.")):  # fmt: skip
        other = st.fedavg(rs, exclude=rule)
        assert other.keys() == out.keys() and all(torch.equal(other[k], out[k]) for k in out)
    assert pickle.loads(pickle.dumps(out)).excluded == out.excluded
    f = io.BytesIO()
    torch.save({"global": out}, f)
    f.seek(0)
    assert torch.load(f, weights_only=True)["global"].excluded == out.excluded
    assert st.fedavg(rs, int_buffers="max").excluded == ()
    # clients may keep their local keys to themselves
    bare = [{k: r.state[k] for k in SHARED} for r in rs]
    alone = st.fedavg(bare, weights=sizes, exclude=lambda k: k.startswith("bn."))
    assert all(torch.equal(alone[k], out[k]) for k in SHARED) and alone.excluded == ()


def test_exclude_names_are_checked():
    rs = results()
    with pytest.raises(AggregationError, match=r"exclude='bn.runing_mean' matches no key"):
        st.fedavg(rs, exclude=["bn.runing_mean"])
    with pytest.raises(AggregationError, match=r"exclude='\*.norm.\*' matches no key"):
        fl.fedmedian(rs, exclude=["*.norm.*"])
    with pytest.raises(TypeError, match=r"not the string 'bn.weight'; pass \['bn.weight'\]"):
        st.fedavg(rs, exclude="bn.weight")
    with pytest.raises(TypeError, match=r"exclude holds 3, a int"):
        fl.FedAdam(exclude=["bn.weight", 3])
    # a local key one client sends and another does not is a mismatch, named
    mixed = [client(0), {k: v for k, v in client(1).items() if k != "enc.bias"}]
    with pytest.raises(AggregationError, match=r"client 1 has different keys.*enc.bias"):
        st.fedavg(mixed, weights="uniform", exclude=["bn.*"])


def test_robust_rules_leave_local_keys_out_of_their_statistics_and_distances():
    states = [client(i) for i in range(7)]
    med = fl.fedmedian(states, exclude=["bn.*"])
    assert list(med) == list(SHARED) and med.excluded == tuple(sorted(LOCAL))
    for k in SHARED:  # median of an odd number of clients: the middle value
        want = torch.stack([s[k] for s in states]).median(0).values
        assert torch.equal(med[k], want)
    trimmed = fl.trimmed_mean(states, 0.2, exclude=["bn.*"])
    assert list(trimmed) == list(SHARED)
    # Krum: a client honest in its weights but with wild BatchNorm statistics (its own
    # domain, not an attack) is chosen once the local keys are out of the distances
    odd = [client(i) for i in range(7)]
    centre = {k: torch.zeros_like(v) for k, v in odd[0].items() if k in SHARED}
    for i, s in enumerate(odd):
        for k in SHARED:
            s[k] = centre[k] + (0.01 if i == 3 else 1.0) * s[k]
    odd[3].update({k: 1000 * odd[3][k] for k in LOCAL[:-1]})
    assert fl.krum(odd, attackers=1).selected != (3,)
    chosen = fl.krum(odd, attackers=1, exclude=["bn.*"])
    assert chosen.selected == (3,) and list(chosen) == list(SHARED)
    assert all(torch.equal(chosen[k], odd[3][k]) for k in SHARED)
    bul = fl.bulyan(odd, attackers=1, exclude=["bn.*"])
    assert list(bul) == list(SHARED) and bul.excluded == tuple(sorted(LOCAL))


def test_clip_leaves_local_keys_as_sent():
    glob = {k: torch.zeros_like(v) for k, v in client(0).items()}
    states = [client(i, wild=50.0) for i in range(3)]
    out = fl.clip(states, glob, max_norm=0.5, exclude=["bn.*"])
    for before, after in zip(states, out):
        assert all(torch.equal(after[k], before[k]) for k in LOCAL)
        d = torch.cat([after[k].reshape(-1).double() for k in SHARED])
        norm = float(torch.cat([before[k].reshape(-1).double() for k in SHARED]).norm())
        assert float(d.norm()) == pytest.approx(min(norm, 0.5), rel=1e-6)
    bare = [{k: s[k] for k in SHARED} for s in states]  # clients that keep them
    again = fl.clip(bare, glob, max_norm=0.5, exclude=lambda k: k.startswith("bn."))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(again, out) for k in SHARED)


def test_server_optimizers_keep_the_servers_local_keys_and_step_the_rest_as_without_them():
    glob = client(10)
    agg = st.fedavg(results(), exclude=["bn.*"])
    server = fl.FedAdam(lr=0.1, exclude=["bn.*"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # bn.* are local: no warning about their statistics
        out = server.step(glob, agg)
    assert list(out) == list(glob)
    for k in LOCAL:
        assert torch.equal(out[k], glob[k])
    plain = fl.FedAdam(lr=0.1)  # the same rule on the shared keys alone
    ref = plain.step({k: glob[k] for k in SHARED}, {k: agg[k] for k in SHARED})
    assert all(torch.equal(out[k], ref[k]) for k in SHARED)
    assert set(server.m) == set(SHARED)  # no moments for the local keys
    # an aggregate that still holds them: the server's values are kept all the same
    everything = st.fedavg(results(), int_buffers="max")
    full = fl.FedAvgM(lr=1.0, momentum=0.0, exclude=["bn.*"]).step(glob, everything)
    assert all(torch.equal(full[k], glob[k]) for k in LOCAL)
    with pytest.raises(AggregationError, match=r"differ in keys \['enc.bias'\]"):
        server.step(glob, {k: agg[k] for k in ("enc.weight", "head.weight")})


def test_a_server_optimizer_built_without_exclude_says_to_build_it_with_fedavgs():
    """Found by an outside audit: the error said the global state and the aggregate differ in
    keys, and blamed the global state, where the fix is the server optimizer's exclude=."""
    glob = client(10)
    agg = st.fedavg(results(), exclude=["bn.*"])
    fix = (r"leaves out keys \['bn.bias', 'bn.num_batches_tracked', 'bn.running_mean', "
           r"'bn.running_var', 'bn.weight'\].*exclude= kept on the clients.*fl.FedAdam was built "
           r"without them.*same exclude= as the aggregator")  # fmt: skip
    with pytest.raises(AggregationError, match=fix):
        fl.FedAdam(lr=0.1).step(glob, agg)
    partly = fl.FedAvgM(exclude=["bn.running_*"])  # some of them: the others still named
    with pytest.raises(AggregationError, match=r"leaves out keys \['bn.bias', 'bn.num.*fl.FedAvgM"):
        partly.step(glob, agg)
    bare = {k: agg[k] for k in SHARED}  # a hand-made aggregate: no .excluded, still a hint
    with pytest.raises(
        AggregationError,
        match=r"differ in keys \['bn.bias'.*keep those keys local.*aggregator's exclude=",
    ):
        fl.FedAdam(lr=0.1).step(glob, bare)


def test_dp_fedavg_needs_no_buffer_policy_for_local_batchnorm():
    pytest.importorskip("opacus")
    glob = {k: torch.zeros_like(v) for k, v in client(0).items()}
    states = [client(i, wild=30.0) for i in range(4)]
    with pytest.raises(AggregationError, match="float buffers"):
        fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=4).step(glob, states)
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=4, exclude=["bn.*"])
    out = dp.step(glob, states)
    assert all(torch.equal(out[k], glob[k]) for k in LOCAL)  # nothing of them left a client
    want, norms = {k: torch.zeros_like(glob[k], dtype=torch.float64) for k in SHARED}, []
    for s in states:  # by hand: updates of the shared keys clipped to 1, summed, / per_round
        norm = float(torch.cat([s[k].reshape(-1).double() for k in SHARED]).norm())
        norms.append(norm)
        for k in SHARED:
            want[k] += s[k].double() * min(1.0, 1.0 / norm) / 4
    assert dp.norms == pytest.approx(norms, rel=1e-12)
    for k in SHARED:
        torch.testing.assert_close(out[k].double(), want[k], atol=1e-7, rtol=0)
    bare = [{k: s[k] for k in SHARED} for s in states]  # or the clients keep them
    again = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=4, exclude=["bn.*"])
    assert all(torch.equal(again.step(glob, bare)[k], out[k]) for k in out)


class Block(Node):
    def __init__(self):
        self.lin, self.bn = nn.Linear(3, 4), nn.BatchNorm1d(4)

    def forward(self, x, ctx):
        return Done(Opaque(self.bn(self.lin(x))))


def test_batchnorm_keys_name_every_batchnorm_key_of_the_state():
    torch.manual_seed(0)
    g = Graph.somatize(Block() >> Block())
    keys = fl.batchnorm_keys(g)
    state = st.state(g)
    assert set(keys) <= set(state) and len(keys) == 10
    assert {k for k in state if ".bn." in k} == set(keys)
    assert fl.batchnorm_keys(nn.Linear(2, 2)) == []


def test_clients_that_leave_their_local_keys_out_are_accepted_by_every_rule():
    """Found by an outside audit: exclude= was resolved against client 0's keys alone, so a
    client 0 without them failed every rule, and Krum failed or not by whom it picked."""

    def state(v, local=True):
        return {"w": torch.full((2,), v), **({"bn.w": torch.full((2,), v)} if local else {})}

    for omitting in range(5):  # each client in turn leaves its local key out
        states = [state(v, i != omitting) for i, v in enumerate((0.9, 1.0, 1.1, 1.3, 50.0))]
        mean = st.fedavg(states, weights="uniform", exclude=["bn.*"])
        assert set(mean) == {"w"} and mean.excluded == ("bn.w",)
        torch.testing.assert_close(mean["w"], torch.full((2,), 54.3 / 5))
        for rule in (fl.fedmedian, lambda s, **k: fl.trimmed_mean(s, 0.2, **k)):
            assert set(rule(states, exclude=["bn.*"])) == {"w"}
        picked = fl.krum(states, attackers=1, exclude=["bn.*"])
        assert set(picked) == {"w"} and picked.excluded == ("bn.w",)
