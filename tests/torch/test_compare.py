"""compare: a sweep's configurations side by side, each summarised over its seeds; the best
configuration is the one with the best mean, not the one with the luckiest run."""

from __future__ import annotations

import pytest

import somatize.torch as st


def test_the_best_configuration_is_the_best_mean_not_the_best_run():
    runs = {
        "lr=0.1": [0.99, 0.50, 0.52],  # one lucky seed
        "lr=0.01": [0.90, 0.91, 0.89],
    }
    c = st.compare(runs, "val_acc")
    assert c.best == "lr=0.01" and c.mode == "max"
    assert c.summaries["lr=0.1"].max == 0.99  # the single best run is lr=0.1's
    assert c.summaries["lr=0.01"].mean == pytest.approx(0.90)
    assert c.ranked() == ["lr=0.01", "lr=0.1"]
    table = str(c).splitlines()
    assert table[1].startswith("lr=0.01") and table[1].endswith("<- best")
    assert "0.9000 ± 0.0100  (n=3, min 0.8900, max 0.9100)" in table[1]


def test_a_loss_is_best_lowest_and_configurations_may_be_any_hashable():
    c = st.compare({(1e-3, 16): [0.5, 0.7], (1e-2, 32): [0.3, 0.4]}, "val_loss")
    assert c.best == (1e-2, 32) and c.mode == "min"
    assert str(c).splitlines()[1].startswith("(0.01, 32)")


def test_it_reads_train_results_as_summarize_does():
    result = st.TrainResult(
        state={}, num_examples=1, steps=1, epochs=1, metrics=[{"step": 1, "val_acc": 0.75}]
    )
    c = st.compare({"a": [result, result]}, "val_acc")
    assert c.summaries["a"].values == (0.75, 0.75)


def test_bad_input_names_the_configuration_and_the_fix():
    with pytest.raises(TypeError, match=r"dict of configuration -> its runs.*summarize"):
        st.compare([0.9, 0.8], "val_acc")
    with pytest.raises(TypeError, match=r"configuration 'a' maps to a float, not a list"):
        st.compare({"a": 0.9}, "val_acc")
    with pytest.raises(ValueError, match=r"configuration 'b' has no runs; give it at least one"):
        st.compare({"a": [0.9], "b": []}, "val_acc")
    with pytest.raises(ValueError, match=r"configuration 'a': 'val_acc' is NaN in run\(s\) \[1\]"):
        st.compare({"a": [0.9, float("nan")]}, "val_acc")
    assert st.compare({"a": [0.9, float("nan")]}, "val_acc", nan="omit").summaries["a"].n == 1
    with pytest.raises(ValueError, match=r"no configurations .*dict is empty; pass \{config"):
        st.compare({}, "val_acc")
    with pytest.warns(UserWarning, match="pass mode='min' if lower is better"):
        st.compare({"a": [1.0], "b": [2.0]}, "score")


# Three seeds whose luck dwarfs the configurations' difference: b is 0.01 above a on each.
LUCK = [0.60, 0.90, 0.75]
SWEEP = {"a": LUCK, "b": [v + 0.01 for v in LUCK]}


def test_unpaired_the_difference_and_its_standard_error_are_those_of_two_samples():
    import math
    import statistics

    c = st.compare(SWEEP, "val_acc")
    assert c.best == "b" and not c.paired
    d = c.vs_best["a"]
    assert d.mean == pytest.approx(-0.01) and d.n == 3 and d.ahead is None
    sa, sb = statistics.stdev(SWEEP["a"]), statistics.stdev(SWEEP["b"])
    assert d.se == pytest.approx(math.sqrt(sa**2 / 3 + sb**2 / 3))
    assert c.distinct("a") is False  # 0.01 against a spread of 0.15: not told apart
    table = str(c)
    assert "a       0.7500 ± 0.1500  (n=3, min 0.6000, max 0.9000)  -0.0100 ± 0.1225 [" in table
    assert table.splitlines()[-1] == (
        "(b is best by its mean, but the 95% confidence interval of a's difference from it "
        "holds 0: these runs do not tell them apart — more seeds, or paired=True where the "
        "runs share seeds)"
    )


def test_paired_each_seeds_luck_cancels_and_the_difference_is_told():
    c = st.compare(SWEEP, "val_acc", paired=True)
    d = c.vs_best["a"]
    assert d.mean == pytest.approx(-0.01) and d.se == pytest.approx(0.0, abs=1e-12)
    assert (d.n, d.ahead) == (3, 0)  # a beat b on no seed
    assert c.distinct("a") is True and c.vs_best["b"].mean == 0
    table = str(c)
    assert "Δ vs best (paired over seeds, ± its standard error, 95% CI)" in table.splitlines()[0]
    assert "-0.0100 ± 0.0000 [-0.0100, -0.0100] (better on 0/3 seeds)" in table
    assert "do not tell them apart" not in table


def test_paired_counts_the_seeds_a_loss_was_lower_on_and_leaves_out_nan_pairs():
    runs = {"x": [1.0, 2.0, float("nan"), 1.5], "y": [1.1, 1.9, 1.0, 1.6]}
    c = st.compare(runs, "val_loss", paired=True, nan="omit")
    assert c.best == "y" and c.mode == "min"  # (mean 1.4, against x's 1.5 over its three)
    d = c.vs_best["x"]
    assert d.n == 3 and d.ahead == 2  # over the seeds both ran, x's loss was lower on two
    assert d.mean == pytest.approx((-0.1 + 0.1 - 0.1) / 3)


def test_paired_refuses_configurations_with_different_numbers_of_runs():
    with pytest.raises(ValueError, match=r"different numbers of runs \('a': 3, 'b': 2\); give"):
        st.compare({"a": [0.1, 0.2, 0.3], "b": [0.1, 0.2]}, "val_acc", paired=True)


def test_one_run_each_says_there_is_no_spread_to_judge_by():
    c = st.compare({"a": [0.9], "b": [0.8]}, "val_acc")
    assert c.distinct("b") is None
    assert str(c).splitlines()[-1] == (
        "(too few runs to tell a from b: a standard error needs two runs each, or two paired seeds)"
    )
    assert "-0.1000" in str(c).splitlines()[2]  # the difference itself is still shown
    # a spread of one run is unknown, not ± 0.0000 (as it was shown)
    assert str(c).splitlines()[1].startswith("a       0.9000 (one run)  (n=1, ")


def test_sampled_parameters_are_labelled_short_and_by_name():
    """Optuna's params (a dict, no key) as tuple(sorted(params.items())): the table names
    them, floats to 4 significant digits, not 0.0020151747022550803."""
    a = tuple(sorted({"lr": 0.0020151747022550803, "width": 64}.items()))
    b = tuple(sorted({"lr": 0.01, "width": 32}.items()))
    c = st.compare({a: [0.9, 0.92], b: [0.8, 0.82]}, "val_acc")
    rows = str(c).splitlines()
    assert rows[1].startswith("lr=0.002015, width=64  0.9100") and c.best == a
    assert rows[2].startswith("lr=0.01, width=32      0.8100")
    assert (
        str(st.compare({(1e-3, 2.5e-06): [0.5]}, "val_acc"))
        .splitlines()[1]
        .startswith("(0.001, 2.5e-06)")
    )


FIVE = {  # five seeds of two configurations, paired: the difference is 2.4 standard errors
    "wide": [0.9749, 0.9748, 0.9664, 0.9778, 0.9690],
    "narrow": [0.9681, 0.9667, 0.9608, 0.9803, 0.9590],
}


def test_paired_the_interval_and_the_verdict_are_scipy_s_paired_t_test():
    stats = pytest.importorskip("scipy.stats")
    c = st.compare(FIVE, "test_f1", paired=True)
    d = c.vs_best["narrow"]
    test = stats.ttest_rel(FIVE["narrow"], FIVE["wide"])
    low, high = test.confidence_interval(0.95)
    assert (d.low, d.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    # 2.4 standard errors over 4 degrees of freedom: p = 0.07, not told apart (with 2 standard
    # errors as the bound it was, claiming 95% where a t-test gives 93%)
    assert abs(d.mean) > 2 * d.se and test.pvalue > 0.05
    assert c.distinct("narrow") is False
    assert "do not tell them apart" in str(c).splitlines()[-1]


@pytest.mark.parametrize("shift", [0.0, 0.004, 0.01, 0.015, 0.03])  # 0.015: 2.5 se, p 0.06
def test_unpaired_the_interval_and_the_verdict_are_scipy_s_welch_test(shift):
    stats = pytest.importorskip("scipy.stats")
    runs = {"a": FIVE["wide"], "b": [v + shift for v in FIVE["narrow"][:4]]}
    c = st.compare(runs, "val_acc")
    other = "b" if c.best == "a" else "a"
    d = c.vs_best[other]
    test = stats.ttest_ind(runs[other], runs[c.best], equal_var=False)
    low, high = test.confidence_interval(0.95)
    assert (d.low, d.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    assert c.distinct(other) is bool(test.pvalue < 0.05)
