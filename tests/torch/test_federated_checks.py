"""fedavg's and the robust aggregators' checks: mismatched keys, shapes and dtypes, NaN and
inf updates, weights, values that are not real tensors; and summarize's NaN runs."""

import pytest
import torch

import somatize.torch as st
from somatize.errors import AggregationError, SomatizeError
from tests.torch.federated_helpers import client, reference, result


def test_mismatched_keys_name_the_client_and_the_key():
    a, b = client(0), client(1)
    del b["enc.lin.bias"]
    with pytest.raises(AggregationError, match=r"client 1 .*missing: \['enc.lin.bias'\]"):
        st.fedavg([a, b], weights="uniform")
    c = client(2)
    c["extra"] = torch.zeros(1)
    with pytest.raises(AggregationError, match=r"client 1 .*unexpected: \['extra'\]"):
        st.fedavg([a, c], weights="uniform")


def test_mismatched_shapes_and_dtypes_name_the_client_and_the_key():
    a, b = client(0), client(1)
    b["enc.lin.weight"] = torch.zeros(6, 5)
    with pytest.raises(AggregationError, match=r"client 1, key 'enc.lin.weight': shape \(6, 5\)"):
        st.fedavg([a, b], weights="uniform")
    c = client(2)
    c["enc.lin.bias"] = c["enc.lin.bias"].double()
    with pytest.raises(
        AggregationError,
        match=r"client 1, key 'enc.lin.bias': dtype torch.float64.*must train the same graph",
    ):
        st.fedavg([a, c], weights="uniform")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_updates_raise_or_are_skipped_and_reported(bad):
    states = [client(i) for i in range(3)]
    states[2]["enc.lin.bias"][0] = bad
    with pytest.raises(AggregationError, match=r"client 2, key 'enc.lin.bias'.*NaN or inf"):
        st.fedavg(states, weights="uniform")
    with pytest.warns(RuntimeWarning, match=r"clients \[2\] skipped"):
        out = st.fedavg(states, weights="uniform", nonfinite="skip")
    assert out.skipped == (2,)
    ref = reference(states[:2], [1, 1])
    torch.testing.assert_close(out["enc.lin.bias"].double(), ref["enc.lin.bias"], atol=1e-6, rtol=0)
    for s in states:
        s["enc.lin.bias"][0] = bad
    with pytest.raises(AggregationError, match=r"NaN or inf \(all 3\); .*learning rate"):
        st.fedavg(states, weights="uniform", nonfinite="skip")


def test_weights_are_validated():
    states = [client(i) for i in range(2)]
    with pytest.raises(AggregationError, match="client 1 has weight -1"):
        st.fedavg(states, weights=[1, -1])
    for bad in (float("inf"), float("-inf"), float("nan")):  # named, not "sum to inf"
        with pytest.raises(AggregationError, match=f"client 0 has weight {bad}; .*finite"):
            st.fedavg(states, weights=[bad, 1])
    with pytest.raises(AggregationError, match="sum to inf .float overflow.; scale them down"):
        st.fedavg(states, weights=[1e308, 1e308])
    with pytest.raises(AggregationError, match="sum to 0"):
        st.fedavg(states, weights=[0, 0])
    with pytest.raises(AggregationError, match="client 0 is a plain state dict"):
        st.fedavg(states)  # no num_examples on plain dicts
    with pytest.raises(AggregationError, match="3 weights for 2 clients"):
        st.fedavg(states, weights=[1, 2, 3])
    with pytest.raises(AggregationError, match="empty"):
        st.fedavg([])
    with pytest.raises(AggregationError, match="sum to 0"):
        st.fedavg([result(s, 0) for s in states])


def test_errors_are_somatize_errors_and_value_errors():
    with pytest.raises(ValueError):
        st.fedavg([])
    with pytest.raises(SomatizeError):
        st.fedavg([])


def test_robust_aggregators_validate_like_fedavg():
    a, b = client(0), client(1)
    b["enc.lin.weight"] = torch.zeros(2)
    with pytest.raises(AggregationError, match="client 1, key 'enc.lin.weight'"):
        st.fedmedian([a, b])
    c = client(2)
    c["enc.lin.bias"][1] = float("nan")
    with pytest.raises(AggregationError, match="client 1, key 'enc.lin.bias'"):
        st.trimmed_mean([a, c], 0.1)


def test_a_value_that_is_not_a_tensor_names_the_client_the_key_and_the_fix():
    a, b = client(0), client(1)
    b["head.scale"] = 0.5
    a["head.scale"] = torch.tensor(0.5)
    with pytest.raises(
        AggregationError, match=r"client 1, key 'head.scale': a float .*torch.tensor"
    ):
        st.fedavg([a, b], weights="uniform")


def test_complex_tensors_are_refused_with_the_fix():
    states = [{"w": torch.randn(3, dtype=torch.complex64)} for _ in range(2)]
    with pytest.raises(AggregationError, match=r"client 0, key 'w': a complex.*view_as_real"):
        st.fedavg(states, weights="uniform")
    with pytest.raises(AggregationError, match="complex"):
        st.fedmedian(states)
    later = [
        {"w": torch.randn(3)},
        {"w": torch.randn(3)},
        {"w": torch.randn(3, dtype=torch.cfloat)},
    ]
    with pytest.raises(AggregationError, match=r"client 2, key 'w': a complex.*view_as_real"):
        st.fedavg(later, weights="uniform")
    later[2] = {"w": "3.0"}
    with pytest.raises(AggregationError, match=r"client 2, key 'w': a str .*not a tensor"):
        st.fedavg(later, weights="uniform")


def test_weights_given_as_a_set_are_refused():
    states = [client(i) for i in range(2)]
    with pytest.raises(AggregationError, match="weights is a set.*list"):
        st.fedavg(states, weights={1.0, 3.0})


def test_summarize_names_nan_runs_or_omits_them():
    with pytest.raises(ValueError, match=r"'val_loss' is NaN in run\(s\) \[1\].*nan='omit'"):
        st.summarize([0.5, float("nan"), 0.4], "val_loss")
    s = st.summarize([0.5, float("nan"), 0.4], "val_loss", nan="omit")
    assert (s.n, s.best, s.min, s.max) == (2, 2, 0.4, 0.5)
    assert s.mean == pytest.approx(0.45)
    with pytest.raises(ValueError, match="every run"):
        st.summarize([float("nan")], "val_acc", nan="omit")


def test_results_that_are_not_a_list_of_clients_say_what_they_are_and_what_to_pass():
    with pytest.raises(TypeError, match=r"aggregate a list .*not a dict \(one client's state"):
        st.fedavg(client(0))
    with pytest.raises(TypeError, match=r"aggregate a list .*not a int; e\.g\. fedavg"):
        st.fedavg(42)
    with pytest.raises(AggregationError, match="list of client results is empty; pass each"):
        st.fedavg([])
    with pytest.raises(TypeError, match=r"client 1 is a int \(7\), .*or its \.state"):
        st.fedavg([client(0), 7], weights="uniform")


def test_a_round_whose_every_client_failed_says_to_keep_the_global_state():
    """With errors="return", dropping the failures can leave nothing: the error says what
    the loop does with such a round, not only that the list is empty."""
    from somatize.torch import federated as fl

    def broken(shared, task):
        raise RuntimeError(f"client {task} lost its connection")

    results = fl.map_clients(None, broken, [0, 1], shared={"w": torch.zeros(2)}, errors="return")
    done = [r for r in results if not isinstance(r, fl.ClientFailure)]
    for rule in (st.fedavg, fl.fedmedian):
        with pytest.raises(AggregationError, match="list of client results is empty") as e:
            rule(done)
        assert "every client failed" in str(e.value)
        assert "keep the global state for that round" in str(e.value)
