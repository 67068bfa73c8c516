"""What fedavg's aggregate holds: integer and bool buffers by policy, Parameters in and plain
tensors out, and an aggregate that pickles and loads with torch.load(weights_only=True)."""

import pickle

import pytest
import torch

import somatize.torch as st
from somatize.errors import AggregationError
from tests.torch.federated_helpers import client


def test_integer_buffers_follow_an_explicit_policy():
    states = [client(i, count=10 * i) for i in (1, 4, 2)]  # counters 10, 40, 20
    with pytest.warns(RuntimeWarning, match="num_batches_tracked.*differ.*int_buffers='max'"):
        assert st.fedavg(states, weights="uniform")["head.bn.num_batches_tracked"].item() == 40
    assert (
        st.fedavg(states, weights="uniform", int_buffers="max")[
            "head.bn.num_batches_tracked"
        ].item()
        == 40
    )  # said explicitly: no warning
    assert (
        st.fedavg(states, weights="uniform", int_buffers="first")[
            "head.bn.num_batches_tracked"
        ].item()
        == 10
    )
    out = st.fedavg(states, weights="uniform", int_buffers="max")
    assert out["head.bn.num_batches_tracked"].dtype == torch.int64
    with pytest.raises(AggregationError, match="num_batches_tracked.*counters"):
        st.fedavg(states, weights="uniform", int_buffers="error")


def test_int_buffers_error_refuses_only_values_that_differ_and_names_the_clients():
    """ "error" refused every integer key, even one every client held alike (where the
    default does not even warn): it now refuses to choose between values, as it says."""
    same = [client(i, count=7) for i in range(3)]
    for rule in (lambda s, **k: st.fedavg(s, weights="uniform", **k), st.fedmedian):
        out = rule(same, int_buffers="error")
        assert out["head.bn.num_batches_tracked"].item() == 7
    states = [client(i, count=7) for i in range(4)]
    states[1]["enc.lin.bias"][0] = float("nan")  # skipped: the names are the clients' own
    states[3]["head.bn.num_batches_tracked"] = torch.tensor(9)
    with pytest.warns(RuntimeWarning, match="skipped"), pytest.raises(AggregationError) as e:
        st.fedmedian(states, int_buffers="error", nonfinite="skip")
    assert str(e.value) == (
        "key 'head.bn.num_batches_tracked': the clients' integer tensors (torch.int64) differ "
        "— client 0 holds 7, client 3 9 — and int_buffers='error' refuses to choose "
        "(averaging counters as floats is wrong); pass int_buffers='max' (the most-trained "
        "client's count) or 'first' (client 0's)"
    )


def test_bool_buffers_are_combined_by_or_and_called_bool_tensors():
    states = [
        {"mask": torch.tensor([True, False, False])},
        {"mask": torch.tensor([False, False, True])},
    ]
    with pytest.warns(RuntimeWarning) as record:
        out = st.fedavg(states, weights="uniform")
    message = str(record[0].message)
    assert "'mask': the clients' bool tensors differ; keeping their logical OR" in message
    assert "integer" not in message and "num_batches_tracked" not in message
    assert out["mask"].tolist() == [True, False, True] and out["mask"].dtype == torch.bool
    assert st.fedavg(states, weights="uniform", int_buffers="max")["mask"].tolist() == [
        True,
        False,
        True,
    ]
    with pytest.raises(
        AggregationError,
        match=r"'mask': the clients' bool tensors \(torch\.bool\) differ at \(0,\) — client 0 "
        r"holds True, client 1 False .*flags.*'max' \(their logical OR\)",
    ):
        st.fedavg(states, weights="uniform", int_buffers="error")


def test_the_aggregate_is_a_picklable_state_dict():
    out = st.fedavg([client(0), client(1)], weights="uniform")
    back = pickle.loads(pickle.dumps(out))
    assert back.keys() == out.keys() and back.weights == out.weights
    assert all(torch.equal(back[k], out[k]) for k in out)


def test_the_aggregate_saved_with_torch_loads_with_weights_only(tmp_path):
    # users save the global state as fedavg returns it; torch.load refuses unknown classes
    with pytest.warns(RuntimeWarning):  # the clients' counters differ
        out = st.fedavg([client(0, count=3), client(1, count=5), client(2)], weights=[1, 2, 0])
    path = tmp_path / "global.pt"
    torch.save({"global": out, "round": 7}, path)
    back = torch.load(path, weights_only=True)  # torch's default since 2.6
    assert back["round"] == 7 and list(back["global"]) == list(out)
    assert all(torch.equal(back["global"][k], out[k]) for k in out)
    assert back["global"]["head.bn.num_batches_tracked"].item() == 10
    g = back["global"]  # an OrderedDict, as a state_dict() is, with the attributes on it
    assert (g.weights, g.skipped, g.selected) == (out.weights, (), (0, 1, 2))
    assert out.weights == pytest.approx((1 / 3, 2 / 3, 0.0))


def test_parameters_in_plain_tensors_out():
    states = [{"w": torch.nn.Parameter(torch.randn(3))} for _ in range(3)]
    for aggregate in (lambda s: st.fedavg(s, weights="uniform"), st.fedmedian):
        out = aggregate(states)
        assert not out["w"].requires_grad and type(out["w"]) is torch.Tensor
    ref = sum(s["w"].detach().double() for s in states) / 3
    torch.testing.assert_close(st.fedavg(states, weights="uniform")["w"].double(), ref)
