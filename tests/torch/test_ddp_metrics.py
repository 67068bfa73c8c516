"""Evaluation and logging under ``torchrun --nproc_per_node=2`` on CPU (gloo): every rank
ends with the values one process computes over all the data, and the logs agree."""

from __future__ import annotations

import csv

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st

from .scripts import ddp_metrics  # the script the ranks run, imported for its model and data
from .test_ddp import said, torchrun


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-metrics")
    assert torchrun(out, script="ddp_metrics.py") == 0, said(out)
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    return out, r0, r1


@pytest.mark.slow
def test_node_metrics_and_metric_objects_are_over_all_ranks_batches(ranks):
    _, r0, r1 = ranks
    assert r0["metrics"] == r1["metrics"] and len(r0["metrics"]) == 2
    # the last evaluation is of the final weights: one process evaluating them agrees,
    # though rank 1 saw no batch of "one" and each rank's Hits only its own batches
    g = ddp_metrics.graph()
    st.load_state(g, r0["state"])
    _, val = ddp_metrics.data()
    last = r0["metrics"][-1]
    for name, batches in val.items():
        single = ddp_metrics.trainer(None).evaluate(g, batches)
        assert any(k.endswith("/conf") for k in single)  # the node metric is there
        for k, v in single.items():
            assert last[f"val_{name}_{k}"] == pytest.approx(v, rel=1e-6), (name, k)


@pytest.mark.slow
def test_a_metric_object_without_merge_is_refused_by_fit_and_evaluate_on_every_rank(ranks):
    _, r0, r1 = ranks
    for r in (r0, r1):
        assert len(r["refused"]) == 3
        for message in r["refused"][:2]:
            assert "'hits' (Unmergeable) has no merge(other)" in message
            assert "torchmetrics.Metric" in message


@pytest.mark.slow
def test_a_torchmetrics_metric_with_list_states_is_refused_when_a_rank_saw_no_batch(ranks):
    pytest.importorskip("torchmetrics")
    from torchmetrics.classification import MulticlassAUROC

    _, r0, r1 = ranks
    for r in (r0, r1):  # refused on every rank alike (no rank left waiting in a collective)
        assert "'auc' (MulticlassAUROC)" in r["refused"][2]
        assert "rank 1 of 2 evaluated no batch" in r["refused"][2]
    # where every rank has a batch, torchmetrics gathers it: the value one process computes
    single = st.Trainer(loss=F.cross_entropy, metrics={"auc": MulticlassAUROC(num_classes=3)})
    expected = single.evaluate(ddp_metrics.graph(), ddp_metrics.data()[1]["all"])
    assert r0["auc_all"] == r1["auc_all"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_logged_step_losses_and_examples_are_over_all_ranks_as_in_the_result(ranks):
    out, r0, _ = ranks
    with (out / "log.csv").open(newline="") as f:
        steps = [row for row in csv.DictReader(f) if row["kind"] == "step"]
    assert [float(row["loss"]) for row in steps] == r0["losses"]
    assert [int(row["examples"]) for row in steps] == [8, 8, 8, 7] * 2  # 4 + 4 and 4 + 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    logged = [e.value for e in events.Scalars("train/loss")]
    assert logged == pytest.approx(r0["losses"], rel=1e-6)
