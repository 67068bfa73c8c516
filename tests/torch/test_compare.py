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
