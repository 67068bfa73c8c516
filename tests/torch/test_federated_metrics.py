"""fl.weighted_metrics: client metrics weighed by the examples evaluated, as Flower does."""

import pytest
import torch

import somatize.torch as st
from somatize import Graph
from somatize.errors import AggregationError
from somatize.torch import federated as fl
from tests.torch.federated_helpers import Linear


def test_weighted_metrics_weigh_by_examples_as_flower_does():
    def evaluated(train, val, metrics):
        return st.TrainResult(state={}, num_examples=train, steps=1, epochs=1,
                              metrics=[{"step": 1, **metrics}], val_examples={"val_": val})  # fmt: skip

    # weighed by the examples evaluated, not the training-set sizes (1000, 1)
    results = [
        evaluated(1000, 10, {"val_loss": 1.0}),
        evaluated(1, 30, {"val_loss": 2.0, "val_acc": 0.5}),
    ]
    out = fl.weighted_metrics(results)
    assert out == {"val_loss": pytest.approx(1.75), "val_acc": 0.5}
    flower = sum(n * v for n, v in [(10, 1.0), (30, 2.0)]) / 40  # flwr's weighted_loss_avg
    assert fl.weighted_metrics([(10, {"loss": 1.0}), (30, {"loss": 2.0})])["loss"] == flower
    with pytest.raises(AggregationError, match="client 1's 'loss' is NaN"):
        fl.weighted_metrics([(10, {"loss": 1.0}), (30, {"loss": float("nan")})])
    with pytest.raises(AggregationError, match="client 0 is a str"):
        fl.weighted_metrics(["x"])
    # a result that does not say (made by hand, by Lightning): its training-set size, and a warning
    bare = st.TrainResult(state={}, num_examples=30, steps=1, epochs=1, metrics=[{"val_loss": 2.0}])
    with pytest.warns(
        UserWarning, match=r"clients \[1\] do not say how many examples their 'val_loss'"
    ):
        assert fl.weighted_metrics([results[0], bare])["val_loss"] == pytest.approx(1.75)


def test_weighted_metrics_of_trained_clients_is_the_pooled_validation_metric():
    # train/val sizes (200, 10) and (10, 200): weighed by training size, the mean was 0.5007
    # where the pooled validation accuracy (and Flower's) is 0.5143
    gen = torch.Generator().manual_seed(0)

    def split(n):
        return [(torch.randn(10, 4, generator=gen), torch.randint(0, 3, (10,), generator=gen))
                for _ in range(n // 10)]  # fmt: skip

    trainer = st.Trainer(loss=torch.nn.functional.cross_entropy,
                         optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                         metrics={"acc": st.accuracy}, options=st.Options(progress=False))  # fmt: skip
    clients = [(split(200), split(10)), (split(10), split(200))]
    graphs = [Graph.somatize(Linear(4, 3)) for _ in clients]
    results = [trainer.fit(g, train, val=val) for g, (train, val) in zip(graphs, clients)]
    assert [r.val_examples for r in results] == [{"val_": 10}, {"val_": 200}]
    pooled = {
        k: sum(trainer.evaluate(g, val)[k] * 10 * len(val) for g, (_, val) in zip(graphs, clients))
        / 210
        for k in ("loss", "acc")
    }
    out = fl.weighted_metrics(results)
    assert out["val_acc"] == pytest.approx(pooled["acc"]) and out["val_loss"] == pytest.approx(
        pooled["loss"]
    )


def test_weighted_metrics_of_results_without_evaluation_point_to_val():
    unevaluated = [st.TrainResult(state={}, num_examples=n, steps=1, epochs=1) for n in (5, 7)]
    with pytest.raises(AggregationError, match=r"none of the 2 clients reports a metric.*val="):
        fl.weighted_metrics(unevaluated)  # a Trainer fitted without val=
    with pytest.raises(AggregationError, match="none of the 2 clients reports a metric"):
        fl.weighted_metrics([(3, {}), (4, {"step": 2, "epoch": 1})])  # only bookkeeping
    # one client that evaluated is enough: the metric is averaged over those that report it
    one = st.TrainResult(state={}, num_examples=1, steps=1, epochs=1, metrics=[{"val_loss": 4.0}],
                         val_examples={"val_": 3})  # fmt: skip
    assert fl.weighted_metrics([*unevaluated, one]) == {"val_loss": 4.0}


def test_metrics_not_a_dict_and_clients_without_examples_say_what_to_give():
    with pytest.raises(AggregationError, match=r"client 0: metrics must be a dict, not int \(4\)"):
        fl.weighted_metrics([(3, 4)])
    with pytest.raises(AggregationError, match=r"'val_acc' has any examples.*above 0"):
        fl.weighted_metrics([(0, {"val_acc": 0.9})])
