"""fedavg, fedmedian and trimmed_mean against float64 references: weighting, order, dtypes,
slice-by-slice sums, scratch buffers; and the federated submodules' docstring examples."""

import random

import pytest
import torch

import somatize.torch as st
from somatize.errors import AggregationError
from tests.torch.federated_helpers import client, reference, result


def test_fedavg_matches_a_float64_reference_weighted_by_num_examples():
    states = [client(i) for i in range(5)]
    sizes = [10, 250, 33, 7, 100]
    out = st.fedavg([result(s, n) for s, n in zip(states, sizes)])
    ref = reference(states, sizes)
    for k, v in ref.items():
        assert out[k].dtype == torch.float32
        assert torch.allclose(out[k].double(), v, atol=1e-6, rtol=0)
    assert out.weights == pytest.approx([n / sum(sizes) for n in sizes])


def test_fedavg_is_independent_of_client_order():
    states = [client(i) for i in range(6)]
    sizes = [3, 1, 4, 1, 5, 9]
    pairs = list(zip(states, sizes))
    first = st.fedavg([s for s, _ in pairs], weights=[n for _, n in pairs])
    random.Random(0).shuffle(pairs)
    second = st.fedavg([s for s, _ in pairs], weights=[n for _, n in pairs])
    for k in first:
        torch.testing.assert_close(first[k], second[k], atol=1e-6, rtol=0)


def test_fedavg_matches_by_name_not_position():
    a, b = client(1), client(2)
    b_reordered = dict(reversed(list(b.items())))
    assert list(b_reordered) != list(a)
    out = st.fedavg([a, b_reordered], weights="uniform")
    torch.testing.assert_close(out["enc.lin.bias"], (a["enc.lin.bias"] + b["enc.lin.bias"]) / 2)
    assert list(out) == list(a)


def test_fedavg_keeps_each_dtype_and_accumulates_in_float64():
    states = [client(i, dtype=torch.bfloat16) for i in range(3)]
    out = st.fedavg(states, weights="uniform")
    assert out["enc.lin.weight"].dtype == torch.bfloat16
    expected = reference(states, [1, 1, 1])["enc.lin.weight"].to(torch.bfloat16)
    assert torch.equal(out["enc.lin.weight"], expected)
    # float64 accumulation: a sum float32 could not hold exactly
    big = [
        {"w": torch.tensor([2.0**24], dtype=torch.float64)},
        {"w": torch.tensor([1.0], dtype=torch.float64)},
    ]
    assert st.fedavg(big, weights=[1, 1])["w"].item() == (2.0**24 + 1) / 2


@pytest.mark.parametrize(
    "chunk, small, group", [(7, 0, 4), (7, 0, 1), (5, 0, 5), (64, 0, 6), (40, 1 << 14, 4)]
)
def test_fedavg_slice_by_slice_is_within_half_an_ulp_of_a_float64_reference(
    monkeypatch, chunk, small, group
):
    # fedavg sums large tensors a cache-sized slice at a time, a group of clients per
    # matrix-vector product, and stacks small ones a group of clients at a time: tiny sizes
    # put many slice boundaries (and a short last slice) inside every tensor, and a short
    # last group (6 clients in groups of 4 or 5), or one client a group, or all in one — of
    # every dtype, non-contiguous tensors included
    from somatize.torch.federated import accumulate

    monkeypatch.setattr(accumulate, "_CHUNK", chunk)
    monkeypatch.setattr(accumulate, "_SMALL", small)
    monkeypatch.setattr(accumulate, "_GROUP", group)
    g = torch.Generator().manual_seed(3)
    states = [
        {
            "w": torch.randn(9, 5, generator=g).t(),  # non-contiguous
            "b": torch.randn(23, generator=g, dtype=torch.float64) * 1e3,
            "h": torch.randn(4, 4, generator=g).to(torch.bfloat16),
            "f": (torch.randn(2, 13, generator=g) * 100).to(torch.float16),
            "one": torch.randn(1, generator=g),  # shorter than any slice
        }
        for _ in range(6)
    ]
    weights = [3.0, 0.0, 1.5, 7.0, 2.0, 1.0]
    out = st.fedavg(states, weights=weights)
    ref = reference(states, weights)
    for k, v in ref.items():
        got = out[k]
        assert got.dtype == states[0][k].dtype and got.shape == states[0][k].shape
        if got.dtype == torch.float64:  # float64 in: the summing order's rounding only
            scale = sum(s[k].abs() * w for s, w in zip(states, weights)) / sum(weights)
            bound = 8 * torch.finfo(torch.float64).eps * scale
        else:  # the float64 sum rounded once to the key's dtype
            ulp = (torch.nextafter(got, torch.full_like(got, float("inf"))) - got).double()
            bound = 0.5 * ulp * (1 + 1e-9)
        assert bool(((got.double() - v).abs() <= bound).all()), k
    # a NaN in a later slice of a later client is still found, and named
    states[4]["w"][3, 8] = float("nan")
    with pytest.raises(AggregationError, match=r"client 4, key 'w'.*NaN or inf"):
        st.fedavg(states, weights=weights)
    with pytest.warns(RuntimeWarning, match=r"clients \[4\] skipped"):
        skipped = st.fedavg(states, weights=weights, nonfinite="skip")
    assert skipped.skipped == (4,) and bool(torch.isfinite(skipped["w"]).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("small", [0, 1 << 14])  # the sliced, grouped path; the stacked one
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, 1, 5])  # the first group (set by a product), later ones
def test_fedavg_rejects_a_nan_or_inf_even_from_a_client_of_weight_zero(
    monkeypatch, dtype, small, bad, where
):
    # the float64 reference sum(w * t) is NaN when a client of weight 0 holds a NaN or inf:
    # the matrix-vector products must not skip zero weights (reference BLAS skips them) nor
    # read the running sum's stale contents, or such an update would pass unseen
    from somatize.torch.federated import accumulate

    monkeypatch.setattr(accumulate, "_CHUNK", 8)
    monkeypatch.setattr(accumulate, "_GROUP", 4)
    monkeypatch.setattr(accumulate, "_SMALL", small)
    states = [{"w": torch.ones(20, dtype=dtype)} for _ in range(6)]
    weights = [1.0] * 6
    weights[where] = 0.0
    assert st.fedavg(states, weights=weights)["w"].eq(1).all()  # finite: the mean of ones
    states[where]["w"][17] = bad  # in the last, short slice
    with pytest.raises(AggregationError, match=rf"client {where}, key 'w'.*NaN or inf"):
        st.fedavg(states, weights=weights)


def test_fedavg_of_large_tensors_matches_a_float64_reference_at_full_size():
    # the real slice and group sizes: a tensor longer than one slice (a short last slice),
    # 6 clients (a short last group), values and weights spread over many binades
    g = torch.Generator().manual_seed(5)
    n = (1 << 18) + 1001
    states = [
        {"w": torch.randn(n, generator=g) * 10.0 ** float(i - 3), "h": torch.randn(n // 7, 7)}
        for i in range(6)
    ]
    for s in states:
        s["h"] = s["h"].to(torch.bfloat16)
    weights = [1e-3, 7.0, 0.25, 1e4, 3.0, 1.0]
    out = st.fedavg(states, weights=weights)
    for k, v in reference(states, weights).items():
        got = out[k]
        # half the gap to the neighbour on the reference's side (a binade's edge has two)
        side = torch.where(v > got.double(), float("inf"), float("-inf")).to(got.dtype)
        bound = 0.5 * (torch.nextafter(got, side).double() - got.double()).abs() * (1 + 1e-9)
        if got.dtype != torch.float32:  # torch casts float64 to bf16 through float32: a value
            bound += v.abs() * 2.0**-24  # a hair past a tie can round twice, to the tie's even
        assert bool(((got.double() - v).abs() <= bound).all()), k


def test_fedavg_reuses_its_slice_buffers_for_every_key():
    from somatize.torch.federated.accumulate import _GROUP, _Scratch

    scratch = _Scratch()
    acc, block = scratch.get(1000, torch.device("cpu"))
    assert acc.dtype == block.dtype == torch.float64
    assert acc.numel() == 1000 and block.numel() == _GROUP * 1000
    again, block2 = scratch.get(10, torch.device("cpu"))  # a later, smaller key
    assert again.data_ptr() == acc.data_ptr() and block2.data_ptr() == block.data_ptr()
    bigger, _ = scratch.get(1001, torch.device("cpu"))  # too small now: made anew, and kept
    assert bigger.numel() == 1001 and scratch.get(5, torch.device("cpu"))[0].data_ptr() == (
        bigger.data_ptr()
    )


def honest_and_malicious(n_honest=7, n_bad=2):
    honest = [client(i) for i in range(n_honest)]
    bad = [client(100 + i, scale=1e6) for i in range(n_bad)]
    return honest, honest + bad


@pytest.mark.parametrize(
    "aggregate", [st.fedmedian, lambda s: st.trimmed_mean(s, 0.25)], ids=["median", "trimmed"]
)
def test_robust_aggregators_resist_a_minority_of_scaled_updates(aggregate):
    honest, everyone = honest_and_malicious()
    honest_mean = reference(honest, [1] * len(honest))["enc.lin.weight"]
    spread = torch.stack([h["enc.lin.weight"].double() for h in honest]).std(0).max()
    robust = aggregate(everyone)["enc.lin.weight"].double()
    naive = st.fedavg(everyone, weights="uniform")["enc.lin.weight"].double()
    assert (robust - honest_mean).abs().max() < 2 * spread  # stays near the honest clients
    assert (naive - honest_mean).abs().max() > 1e4  # while the plain mean is dragged away


def test_fedmedian_and_trimmed_mean_against_sorted_references():
    states = [{"w": torch.tensor([v, -v])} for v in (5.0, 1.0, 3.0, 2.0)]
    assert st.fedmedian(states)["w"].tolist() == [2.5, -2.5]  # even count: mean of the middle two
    assert st.fedmedian(states[:3])["w"].tolist() == [3.0, -3.0]
    assert st.trimmed_mean(states, 0.25)["w"].tolist() == [2.5, -2.5]
    assert st.trimmed_mean(states, 0.0)["w"].tolist() == [2.75, -2.75]
    with pytest.raises(ValueError, match="beta"):
        st.trimmed_mean(states, 0.5)


def test_the_submodules_docstring_examples_run():
    import doctest
    import importlib

    names = ["aggregation", "robust", "partitions", "sampling", "server", "privacy"]
    names += ["regularizers", "metrics", "clients"]
    for name in names:
        module = importlib.import_module(f"somatize.torch.federated.{name}")
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0, name


def test_fedavg_reuses_its_blocks_for_every_group_and_key():
    # fresh buffers of a block's size come from fresh pages, whose faults cost more than
    # the sums: small tensors are stacked into blocks kept for the whole call
    from somatize.torch.federated.accumulate import _Scratch

    scratch = _Scratch()
    first = scratch.block(64, 4096, torch.float32)
    again = scratch.block(10, 64, torch.float32)  # a later, smaller group or key: the same memory
    assert again.shape == (10, 64) and again.data_ptr() == first.data_ptr()
    other = scratch.block(10, 64, torch.float64)  # a block per dtype
    assert other.dtype == torch.float64 and other.data_ptr() != first.data_ptr()
    bigger = scratch.block(65, 4096, torch.float32)  # too small now: made anew, and kept
    assert bigger.shape == (65, 4096) and scratch.block(1, 1, torch.float32).data_ptr() == (
        bigger.data_ptr()
    )
