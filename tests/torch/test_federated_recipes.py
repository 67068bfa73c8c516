"""The federated recipes: FedAvg beats FedSGD, any executor gives the serial round, strategies run."""

import os

import pytest
import torch

import somatize.torch as st
from recipes import federated as fed
from recipes import federated_strategies as strategies


def small_round(pool):
    return fed.federate(4, rounds=2, local_epochs=1, batch_size=20, seed=1, pool=pool)


@pytest.fixture(scope="module")
def serial_round():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return small_round(None)
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_federated_round_on_the_process_pool_equals_the_serial_loop(serial_round):
    with fed.executor("process") as pool:
        curve, state = small_round(pool)
    assert curve == serial_round[0]
    assert state.keys() == serial_round[1].keys()
    assert all(torch.equal(state[k], serial_round[1][k]) for k in state)


def _pid(_):
    return os.getpid()


@pytest.mark.slow
def test_federated_round_on_a_dask_cluster_equals_the_serial_loop(serial_round):
    pytest.importorskip("dask.distributed")
    with fed.executor("dask") as pool:
        pids = set(pool.map(_pid, range(8)))
        curve, state = small_round(pool)
    assert os.getpid() not in pids and len(pids) >= 1
    assert curve == serial_round[0]
    assert all(torch.equal(state[k], serial_round[1][k]) for k in state)


@pytest.mark.slow
def test_fedavg_beats_fedsgd_at_equal_rounds():
    fedavg_curve, _ = fed.federate(10, rounds=8, local_epochs=5)
    fedsgd_curve, _ = fed.federate(10, rounds=8, local_epochs=0)
    assert fedavg_curve[-1] > fedsgd_curve[-1] + 0.2
    assert fedavg_curve[-1] > 0.5


def test_the_strategies_recipe_logs_one_tensorboard_run_per_strategy(tmp_path, capsys):
    names = ["fedavg", "fedprox", "fedadam", "scaffold"]
    assert strategies.main(["--rounds", "4", "--only", *names, "--logdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "100 clients, 1347 examples" in out  # the Dirichlet(0.5) histogram
    table = out.split("strategy")[-1].splitlines()
    assert [line.split()[0] for line in table[1:]] == names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    finals = {}
    for name in names:
        acc = EventAccumulator(str(tmp_path / name / "seed0"))
        acc.Reload()
        logged = [e.value for e in acc.Scalars("test/acc")]
        assert len(logged) == 4 and len(acc.Scalars("train/loss")) == 4
        finals[name] = float(next(line for line in table if line.startswith(name)).split()[1])
        assert logged[-1] == pytest.approx(finals[name], abs=5e-4)  # the table's final accuracy
    assert max(finals.values()) > 0.2  # above chance (0.1) after four rounds of ten clients
    assert len(set(finals.values())) > 1  # the strategies differ


def test_the_strategies_recipe_compares_strategies_over_seeds_paired(tmp_path, capsys):
    names = ["fedavg", "fedadam"]
    argv = ["--rounds", "2", "--only", *names, "--seeds", "2", "--logdir", str(tmp_path)]
    assert strategies.main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.split("strategy")[-1].splitlines()[1:]}
    assert list(rows) == names and "Δ final vs fedavg, paired" in out
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def curve(name: str, run: str) -> list[float]:
        acc = EventAccumulator(str(tmp_path / name / run))
        acc.Reload()
        return [e.value for e in acc.Scalars("test/acc")]

    finals = {n: [curve(n, f"seed{s}")[-1] for s in (0, 1)] for n in names}
    assert finals["fedavg"][0] != finals["fedavg"][1]  # each seed a replicate of its own
    for n in names:  # the mean over seeds, per round, logged beside them
        means = [sum(v) / 2 for v in zip(curve(n, "seed0"), curve(n, "seed1"))]
        assert curve(n, "mean") == pytest.approx(means, abs=1e-6)
        mean = sum(finals[n]) / 2
        assert rows[n].split()[1] == f"{mean:.3f}"  # the table's mean of the final accuracies
    # the paired column: fedadam minus fedavg on the same seed, averaged over the seeds
    diffs = [a - b for a, b in zip(finals["fedadam"], finals["fedavg"])]
    assert f"{sum(diffs) / 2:+.3f} ± " in rows["fedadam"]
    assert f"(ahead on {sum(d > 0 for d in diffs)}/2)" in rows["fedadam"]


def test_the_strategies_recipe_starts_each_seed_from_its_own_initial_weights():
    a, b = strategies.make_graph(0), strategies.make_graph(1)
    sa, sb = st.state(a), st.state(b)
    assert not torch.equal(sa["dense.lin.weight"], sb["dense.lin.weight"])
    assert all(torch.equal(sa[k], st.state(strategies.make_graph(0))[k]) for k in sa)


def test_fedbn_keeps_each_clients_batchnorm_and_beats_fedavg_under_feature_shift():
    from recipes import federated_bn as fedbn

    avg, _, none = fedbn.federate("fedavg", rounds=5)
    bn, state, local = fedbn.federate("fedbn", rounds=5)
    assert none == {} and bn[-1] > avg[-1] + 0.2 and bn[-1] > 0.8
    keys = fedbn.fl.batchnorm_keys(fedbn.make_graph())
    initial = st.state(fedbn.make_graph())
    assert all(torch.equal(state[k], initial[k]) for k in keys)  # the server's, never averaged
    assert sorted(local) == list(range(6)) and all(set(v) == set(keys) for v in local.values())
    # each client's own statistics follow its scanner's contrast a (variance ∝ a²)
    var = [float(local[c]["hidden.bn.running_var"].mean()) for c in range(6)]
    contrast = [a for a, _ in fedbn.SCANNERS]
    assert sorted(range(6), key=var.__getitem__) == sorted(range(6), key=contrast.__getitem__)


@pytest.mark.slow
def test_fedbn_round_on_the_process_pool_equals_the_serial_loop():
    from recipes import federated_bn as fedbn

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = fedbn.federate("fedbn", rounds=2, n=4)
    finally:
        torch.set_num_threads(before)
    with st.executor(workers=2) as pool:
        pooled = fedbn.federate("fedbn", rounds=2, n=4, pool=pool)
    assert pooled[0] == serial[0]
    assert all(torch.equal(pooled[1][k], serial[1][k]) for k in serial[1])
    assert all(
        torch.equal(pooled[2][c][k], serial[2][c][k]) for c in serial[2] for k in serial[2][c]
    )
