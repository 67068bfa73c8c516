"""Partitions and client sampling: deterministic, disjoint, complete; the skew each promises."""

import numpy as np
import pytest
import torch

from somatize.torch import federated as fl

LABELS = np.repeat(np.arange(10), 200)  # 2,000 examples, 10 balanced classes
np.random.default_rng(0).shuffle(LABELS)


def covers_once(parts, n):
    flat = [i for p in parts for i in p]
    assert len(flat) == n and sorted(flat) == list(range(n))  # disjoint and complete


SPLITS = {
    "iid": lambda seed: fl.iid(LABELS, clients=20, seed=seed),
    "iid_n": lambda seed: fl.iid(len(LABELS), clients=20, seed=seed),
    "shards": lambda seed: fl.shards(LABELS, clients=20, per_client=2, seed=seed),
    "dirichlet": lambda seed: fl.dirichlet(LABELS, clients=20, alpha=0.5, seed=seed),
    "quantity": lambda seed: fl.quantity_skew(LABELS, clients=20, alpha=0.5, seed=seed),
}


@pytest.mark.parametrize("name", SPLITS)
def test_partitions_are_deterministic_disjoint_and_complete(name):
    split = SPLITS[name]
    a, b, c = split(0), split(0), split(1)
    assert a == b and a != c
    covers_once(a, len(LABELS))
    assert len(a) == 20 and all(isinstance(i, int) for i in a[0])


def mean_classes(parts):
    return np.mean([len(set(LABELS[p].tolist())) for p in parts])


def label_distance_from_global(parts):
    """Mean total-variation distance between each client's label mix and the global one."""
    h = np.array(fl.histogram(LABELS, parts).counts, dtype=float)
    h /= h.sum(1, keepdims=True)
    return float(np.abs(h - 0.1).sum(1).mean() / 2)


def test_dirichlet_small_alpha_concentrates_labels_large_alpha_approaches_iid():
    skewed = fl.dirichlet(LABELS, clients=20, alpha=0.05, seed=0)
    mild = fl.dirichlet(LABELS, clients=20, alpha=1.0, seed=0)
    flat = fl.dirichlet(LABELS, clients=20, alpha=1e4, seed=0)
    iid = label_distance_from_global(fl.iid(LABELS, clients=20, seed=0))
    d = [label_distance_from_global(p) for p in (skewed, mild, flat)]
    assert d[0] > 0.6 > d[1] > d[2]  # fixed seed: small α → a few classes per client
    assert mean_classes(skewed) < 4 and mean_classes(flat) == 10
    assert d[2] < 2 * iid + 0.02  # α → ∞ is as close to the global mix as an IID split


def test_dirichlet_min_size_and_its_error():
    parts = fl.dirichlet(LABELS, clients=20, alpha=0.5, seed=3, min_size=50)
    assert min(len(p) for p in parts) >= 50
    covers_once(parts, len(LABELS))
    with pytest.raises(ValueError, match="raise alpha, lower min_size"):
        fl.dirichlet(LABELS, clients=200, alpha=0.01, seed=0, min_size=9)
    with pytest.raises(ValueError, match="cannot give 300 clients 10 each"):
        fl.dirichlet(LABELS, clients=300, alpha=1.0, min_size=10)
    with pytest.raises(ValueError, match="alpha must be positive"):
        fl.dirichlet(LABELS, clients=2, alpha=0)


def test_alpha_must_be_a_finite_positive_number_and_its_errors_say_what_to_use():
    """alpha=inf said 'no Dirichlet split in 1000 draws ... raise alpha', alpha='0.5' was a
    bare TypeError ('>' not supported), and an alpha past numpy's range redrew 1000 times."""
    for split, data in ((fl.dirichlet, LABELS), (fl.quantity_skew, len(LABELS))):
        name = split.__name__
        with pytest.raises(ValueError, match=rf"{name}\(alpha=inf\).*finite.*fl\.iid"):
            split(data, clients=3, alpha=float("inf"))
        for bad in ("0.5", None, True, [0.5]):
            with pytest.raises(ValueError, match=rf"{name}\(alpha=...\) is the Dirichlet conc"):
                split(data, clients=3, alpha=bad)
        for bad in (0, -1.0, float("nan"), float("-inf")):
            with pytest.raises(ValueError, match="alpha must be positive"):
                split(data, clients=3, alpha=bad)
        with pytest.raises(ValueError, match=rf"{name}\(alpha=1e\+308\) over 3 .*overflows"):
            split(data, clients=3, alpha=1e308)
        same = split(data, clients=3, alpha=np.float32(0.5), seed=1)
        assert same == split(data, clients=3, alpha=0.5, seed=1)  # numpy's reals, as floats


def test_shards_give_each_client_few_classes():
    parts = fl.shards(LABELS, clients=20, per_client=2, seed=0)
    assert max(len(set(LABELS[p].tolist())) for p in parts) <= 4  # two shards, each ≤ 2 labels
    assert {len(p) for p in parts} == {100}


def test_quantity_skew_varies_sizes_not_labels():
    parts = fl.quantity_skew(LABELS, clients=20, alpha=0.3, seed=0, min_size=5)
    sizes = [len(p) for p in parts]
    assert min(sizes) >= 5 and max(sizes) > 4 * np.median(sizes)
    big = max(parts, key=len)
    assert len(set(LABELS[big].tolist())) == 10


def test_histogram_counts_and_prints_a_table():
    parts = fl.dirichlet(LABELS, clients=30, alpha=0.5, seed=0)
    h = fl.histogram(torch.as_tensor(LABELS), parts)
    assert h.classes == tuple(range(10))
    for p, row in zip(parts, h.counts):
        assert list(row) == np.bincount(LABELS[p], minlength=10).tolist()
    text = str(h)
    assert text.splitlines()[0].split()[:3] == ["client", "0", "1"]
    assert "… 10 more clients" in text and "30 clients, 2000 examples" in text


def test_bad_labels_are_named():
    with pytest.raises(ValueError, match="integers"):
        fl.dirichlet([0.5, 1.5], clients=1, alpha=1)
    with pytest.raises(ValueError, match="1-d"):
        fl.shards(np.zeros((2, 2), dtype=int), clients=1)
    with pytest.raises(ValueError, match="clients must be a positive int"):
        fl.iid(10, clients=0)


def test_sample_is_deterministic_in_seed_and_round():
    a = fl.sample(100, fraction=0.1, round=5, seed=0)
    assert a == fl.sample(100, fraction=0.1, round=5, seed=0)
    assert a == sorted(set(a)) and len(a) == 10 and all(0 <= c < 100 for c in a)
    rounds = [tuple(fl.sample(100, fraction=0.1, round=r, seed=0)) for r in range(20)]
    assert len(set(rounds)) == 20
    assert fl.sample(100, fraction=0.1, round=5, seed=1) != a
    assert len(fl.sample(100, fraction=0.29, round=0)) == 29  # not 28.999999999999996
    assert len(fl.sample(10, fraction=0.01, round=0)) == 1  # at least one client
    assert len(fl.sample(10, count=3, round=0)) == 3


def test_sample_weighted_by_size_prefers_big_clients():
    sizes = [1] * 90 + [1000] * 10
    picks = [c for r in range(50) for c in fl.sample(100, count=10, round=r, weights=sizes)]
    assert np.mean([c >= 90 for c in picks]) > 0.7  # 10 big clients hold ~99% of the weight
    with pytest.raises(ValueError, match="only 2 clients have a positive weight.*at most 2"):
        fl.sample(3, count=3, round=0, weights=[1, 1, 0])
    with pytest.raises(ValueError, match=r"3 finite non-negative numbers .*not 2 value\(s\)"):
        fl.sample(3, count=2, round=0, weights=[1, 1])


def test_the_largest_inclusion_bound_is_never_below_what_sample_draws():
    # DPFedAvg(weights=) charges epsilon at this rate; below the truth, epsilon would be
    # under-reported for the client drawn most often
    from somatize.torch.federated.sampling import _largest_inclusion

    labels = np.random.default_rng(0).integers(0, 10, 5000)
    profiles = {
        "dirichlet": [len(p) for p in fl.dirichlet(labels, clients=100, alpha=0.5, seed=0)],
        "quantity": [len(p) for p in fl.quantity_skew(labels, clients=100, alpha=0.3, seed=0)],
        "two sizes": [1] * 90 + [30] * 10,
    }
    rounds = 4000
    for name, sizes in profiles.items():
        big = int(np.argmax(sizes))
        drawn = sum(
            big in fl.sample(100, count=10, round=r, seed=1, weights=sizes) for r in range(rounds)
        )
        q = drawn / rounds
        bound = _largest_inclusion(sizes, 10, 100)
        assert q - 4 * (q * (1 - q) / rounds) ** 0.5 <= bound <= 1, name
        if name == "dirichlet":  # tight for moderate skew: 0.163 against 0.160
            assert bound - q < 0.015
    assert _largest_inclusion([3.0] * 100, 10, 100) == 0.1  # equal weights: m/N exactly
    # the others equal: the bound is the exact 1 − P(missed at the 1st) · P(missed at the 2nd)
    assert _largest_inclusion([1, 1, 1, 97], 2, 4) == pytest.approx(1 - 0.03 * (1 - 0.97 / 0.99))
    assert _largest_inclusion([1, 1, 1, 97], 4, 4) == 1.0  # every client, every round


def test_sample_errors():
    with pytest.raises(ValueError, match="exactly one of fraction"):
        fl.sample(10, round=0)
    with pytest.raises(ValueError, match="fraction must be in"):
        fl.sample(10, fraction=1.5, round=0)
    for bad in (True, "0.5"):  # (True was taken as 1: every client)
        with pytest.raises(TypeError, match=r"fraction is a number in \(0, 1\].*count=10"):
            fl.sample(10, fraction=bad, round=0)
    assert len(fl.sample(10, fraction=np.float32(0.5), round=0)) == 5
    with pytest.raises(ValueError, match=r"count must be an int in \[1, 10\]"):
        fl.sample(10, count=11, round=0)
    with pytest.raises(ValueError, match="round must be"):
        fl.sample(10, count=1, round=-1)


def test_sample_takes_numpy_integers_and_names_a_bad_seed():
    want = fl.sample(100, count=7, round=3, seed=5)
    n, r, s, c = np.int64(100), np.int32(3), np.uint8(5), np.int64(7)
    assert fl.sample(n, count=c, round=r, seed=s) == want  # as len(parts), np.arange give
    assert fl.sample(n, fraction=np.float64(0.07), round=r, seed=s) == want
    assert fl.sample(100, count=7, round=torch.tensor(3), seed=5) == want  # operator.index
    with pytest.raises(ValueError, match=r"seed must be a non-negative int.*not -1"):
        fl.sample(10, count=1, round=0, seed=-1)
    with pytest.raises(ValueError, match=r"seed must be a non-negative int.*not 0\.5"):
        fl.sample(10, count=1, round=0, seed=0.5)
    with pytest.raises(ValueError, match=r"round must be a non-negative int, not 1\.0"):
        fl.sample(10, count=1, round=1.0)
    with pytest.raises(ValueError, match="clients must be a positive int.*not True"):
        fl.sample(True, count=1, round=0)
    with pytest.raises(ValueError, match=r"count must be an int in \[1, 10\]"):
        fl.sample(10, count=np.bool_(True), round=0)


@pytest.mark.parametrize(
    "split",
    [
        lambda m: fl.dirichlet(np.repeat(np.arange(10), 3), clients=20, alpha=0.3, min_size=m),
        lambda m: fl.quantity_skew(20, clients=10, alpha=0.05, min_size=m),
    ],
    ids=["dirichlet", "quantity_skew"],
)
def test_min_size_0_may_leave_clients_empty_and_says_which(split):
    with pytest.warns(RuntimeWarning, match=r"min_size=0\): client\(s\) \[.*hold no examples") as w:
        parts = split(0)
    empty = [c for c, p in enumerate(parts) if not p]
    assert empty and str(empty[:10])[1:-1] in str(w[0].message)  # the very clients, named
    # such a client never reaches fedavg (it "weighed 0 in fedavg", the warning said)
    assert "Trainer.fit refuses" in str(w[0].message) and "fedavg" not in str(w[0].message)
    covers_once(parts, 30 if len(parts) == 20 else 20)
    assert min(len(p) for p in split(1)) >= 1  # the default: none empty, no warning
    with pytest.raises(ValueError, match="min_size must be a non-negative int.*not -1"):
        split(-1)


def test_dirichlet_redraws_when_only_full_clients_drew_a_share():
    # alpha=0.01 puts a class's whole share on one or two clients; when those are full,
    # the other shares are 0.0 and normalising them gave NaN ("repeats may not contain
    # negative values"): such a draw is now redrawn like one that misses min_size
    y = np.repeat(np.arange(10), 3)
    for seed in (1, 2, 3):
        parts = fl.dirichlet(y, clients=12, alpha=0.01, seed=seed)
        covers_once(parts, 30)
        assert min(len(p) for p in parts) >= 1
    with pytest.raises(ValueError, match=r"no Dirichlet\(alpha=0.001\) split in 1000 draws"):
        fl.dirichlet(np.repeat(np.arange(4), 50), clients=40, alpha=0.001)


@pytest.mark.parametrize(
    "data",
    [
        23,
        np.int64(23),
        torch.randn(23, 3),  # features: the count is the first dimension
        torch.randn(23),  # float regression targets
        np.zeros((23, 2, 2)),
        list(range(23)),
        torch.utils.data.TensorDataset(torch.randn(23, 3), torch.randn(23)),
    ],
    ids=["int", "np.int64", "features", "float-targets", "array-3d", "list", "TensorDataset"],
)
def test_iid_and_quantity_skew_take_anything_with_a_length(data):
    # only the count is used, as the docs say: the same split as for the int
    assert fl.iid(data, clients=4, seed=1) == fl.iid(23, clients=4, seed=1)
    assert fl.quantity_skew(data, clients=4, alpha=0.5, seed=1) == fl.quantity_skew(
        23, clients=4, alpha=0.5, seed=1
    )
    covers_once(fl.iid(data, clients=4), 23)


def test_a_count_without_a_length_is_named_with_the_fix():
    for bad in (None, 23.0, torch.tensor(23)):  # (a 0-d tensor has no length)
        with pytest.raises(TypeError, match=r"iid\(data=...\) takes the number of examples.*len"):
            fl.iid(bad, clients=2)
    with pytest.raises(TypeError, match=r"quantity_skew\(data=...\).*not a NoneType"):
        fl.quantity_skew(None, clients=2, alpha=1)
    with pytest.raises(ValueError, match=r"iid\(data=-1\): a count of examples cannot be negative"):
        fl.iid(-1, clients=2)
    with pytest.raises(
        ValueError, match="3 examples cannot give 4 clients one each; use at most 3"
    ):
        fl.iid(3, clients=4)  # (iid has no min_size to offer)
    # a string has a length, which was split as a count of examples (a path: one per letter)
    with pytest.raises(TypeError, match=r"iid\(data='data/train.csv'\): a str is not data"):
        fl.iid("data/train.csv", clients=3)
    with pytest.raises(TypeError, match=r"quantity_skew\(data=b'x'\): a bytes is not data"):
        fl.quantity_skew(b"x", clients=1, alpha=1)


def test_label_splits_given_a_data_set_say_how_to_pass_its_labels():
    ds = torch.utils.data.TensorDataset(torch.randn(20, 3), torch.arange(20) % 2)
    fix = r"not a data set \(TensorDataset\); pass its labels: ds\.tensors\[1\]"
    for split in (
        lambda y: fl.dirichlet(y, clients=2, alpha=1),
        lambda y: fl.shards(y, clients=2),
        lambda y: fl.histogram(y, [list(range(20))]),
    ):
        with pytest.raises(ValueError, match=fix):
            split(ds)
        assert split(ds.tensors[1]) == split([y for _, y in ds])  # both fixes work
    with pytest.raises(ValueError, match=r"Subset\); pass its labels: \[y for _, y in ds\]"):
        fl.dirichlet(torch.utils.data.Subset(ds, [0, 1]), clients=2, alpha=1)
    with pytest.raises(ValueError, match="uneven items.*one int per example"):
        fl.dirichlet([[0], [1, 2]], clients=2, alpha=1)
    with pytest.raises(ValueError, match=r"shape \(3, 3\); for one-hot labels pass"):
        fl.shards(np.eye(3), clients=1)


def test_shards_error_states_its_own_requirement_and_arguments():
    with pytest.raises(ValueError) as e:
        fl.shards(list(range(10)), clients=7)
    msg = str(e.value)
    assert "clients × per_client = 7 × 2 = 14 shards of at least one example" in msg
    assert "per_client=1 with clients=7" in msg and "clients=5 with per_client=2" in msg
    assert "min_size" not in msg  # shards has no such argument
    assert len(fl.shards(list(range(10)), clients=7, per_client=1)) == 7  # the fix it names
    assert len(fl.shards(list(range(10)), clients=5)) == 5
    with pytest.raises(ValueError, match="per_client must be a positive int.*not 0"):
        fl.shards(list(range(10)), clients=2, per_client=0)
    with pytest.raises(ValueError, match="3 examples cannot give 7 clients one each"):
        fl.shards([0, 1, 2], clients=7)
