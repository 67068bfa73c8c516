"""Metrics over the whole set: objects with reset/update/compute, torchmetrics as it is."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(Opaque(out), metrics={"mean": out.detach().mean()})


def data():
    gen = torch.Generator().manual_seed(0)
    sizes = [8, 8, 3]  # a smaller last batch: a per-batch mean of F1 would be wrong
    return [
        (torch.randn(n, 3, generator=gen), torch.randint(0, 2, (n,), generator=gen)) for n in sizes
    ]


def f1_by_hand(pred, y):
    """Macro F1 over the two classes."""
    scores = []
    for c in (0, 1):
        tp = ((pred == c) & (y == c)).sum().item()
        fp = ((pred == c) & (y != c)).sum().item()
        fn = ((pred != c) & (y == c)).sum().item()
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / 2


class Positives:
    """A metric object of our own: the fraction of positives predicted, over the set."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.reset()

    def reset(self) -> None:
        self.calls.append("reset")
        self.hits = self.total = 0

    def update(self, out, y) -> None:
        self.calls.append("update")
        self.hits += int((out.argmax(-1) == 1).sum())
        self.total += len(y)

    def compute(self):
        self.calls.append("compute")
        return self.hits / self.total


def test_metric_objects_compute_over_the_whole_set_and_functions_average_over_examples():
    torchmetrics = pytest.importorskip("torchmetrics")
    torch.manual_seed(0)
    g = Graph.somatize(Linear())
    val = data()
    positives = Positives()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        metrics={
            "f1": torchmetrics.classification.MulticlassF1Score(
                num_classes=2, average="macro"
            ),  # as it is
            "pos": positives,
            "acc": st.accuracy,
        },
    )
    for _ in range(2):  # reset at each evaluation: the second gives the same numbers
        got = trainer.evaluate(g, val)
    net = g["linear"].lin
    with torch.no_grad():
        pred = torch.cat([net(x).argmax(-1) for x, _ in val])
        ys = torch.cat([y for _, y in val])
        means = torch.cat([net(x) for x, _ in val]).mean(-1)
        weighted = sum(float(net(x).mean()) * len(x) for x, _ in val) / len(ys)
    assert got["f1"] == pytest.approx(f1_by_hand(pred, ys))
    assert got["pos"] == pytest.approx(float((pred == 1).float().mean()))
    assert got["acc"] == pytest.approx(float((pred == ys).float().mean()))
    # the node's metric, averaged over examples
    assert got["linear/mean"] == pytest.approx(weighted, rel=1e-5)
    assert got["linear/mean"] == pytest.approx(float(means.mean()), rel=1e-5)
    assert list(got) == ["loss", "f1", "pos", "acc", "linear/mean"]
    assert positives.calls == ["reset", *["reset", "update", "update", "update", "compute"] * 2]


def test_fit_logs_metric_objects_and_node_metrics_as_val_names():
    torchmetrics = pytest.importorskip("torchmetrics")
    torch.manual_seed(0)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={
            "f1": torchmetrics.classification.MulticlassF1Score(num_classes=2, average="macro")
        },
        options=st.Options(progress=False, monitor="val_f1", mode="max"),
    ).fit(Graph.somatize(Linear()), data(), val=data())
    assert {"val_loss", "val_f1", "val_linear/mean"} <= set(result.metrics[-1])
    assert result.best == result.metric("val_f1")


def test_a_metric_object_computing_a_vector_is_refused():
    class Vector(Positives):
        def compute(self):
            return torch.ones(2)

    with pytest.raises(TypeError, match="metric 'v' computed a tensor of shape"):
        st.Trainer(loss=F.cross_entropy, metrics={"v": Vector()}).evaluate(
            Graph.somatize(Linear()), data()
        )


def test_a_confusion_matrix_is_refused_naming_predict_which_gives_it_as_torch_does():
    from torchmetrics.classification import MulticlassConfusionMatrix

    torch.manual_seed(0)
    g, val = Graph.somatize(Linear()), data()
    matrix = {"cm": MulticlassConfusionMatrix(num_classes=2)}
    with pytest.raises(TypeError, match=r"\(2, 2\).*confusion matrix.*trainer\.predict\(model"):
        st.Trainer(loss=F.cross_entropy, metrics=matrix).evaluate(g, val)
    # the way the message (and trainer.md) gives, against a matrix counted by hand
    logits = torch.cat(st.Trainer().predict(g, val))
    y = torch.cat([y for _, y in val])
    got = MulticlassConfusionMatrix(num_classes=2)(logits, y)
    with torch.no_grad():
        predicted = st.module(g)(torch.cat([x for x, _ in val])).argmax(-1)
    hand = torch.zeros(2, 2, dtype=torch.long)
    for t, p in zip(y.tolist(), predicted.tolist(), strict=True):
        hand[t, p] += 1
    assert torch.equal(got, hand)


class Mergeable(Positives):
    def merge(self, other: Positives) -> None:
        self.hits += other.hits
        self.total += other.total


def test_under_ddp_a_metric_object_must_merge_or_be_a_torchmetrics_metric():
    import torchmetrics

    from somatize.errors import SettingError
    from somatize.torch.metrics import check_ranks

    check_ranks({"pos": Positives(), "acc": st.accuracy}, world=1)  # one process: no merge
    check_ranks({"pos": Mergeable(), "f1": torchmetrics.classification.BinaryF1Score()}, 2)
    with pytest.raises(SettingError, match=r"'pos' \(Positives\) has no merge\(other\)"):
        check_ranks({"pos": Positives()}, world=2)
    unsynced = torchmetrics.classification.BinaryF1Score(sync_on_compute=False)
    with pytest.raises(SettingError, match="'f1' .*sync_on_compute=False.*leave"):
        check_ranks({"f1": unsynced}, world=2)


class Reports(Node):
    def __init__(self, metrics) -> None:
        self.lin, self.metrics = nn.Linear(3, 2), metrics

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)), metrics=self.metrics)


@pytest.mark.parametrize(
    ("metrics", "match"),
    [
        ([1], r"node 'reports' returned Done\(..., metrics=\[1\]\); metrics is a dict"),
        ({"m": "x"}, r"node 'reports': metric 'm' gave 'x' \(str\), not a number"),
        ({"m": None}, r"node 'reports': metric 'm' gave None \(NoneType\), not a number"),
    ],
)
def test_bad_node_metrics_are_named_by_node_and_metric(metrics, match):
    with pytest.raises(TypeError, match=match):
        st.Trainer(loss=F.cross_entropy).evaluate(Graph.somatize(Reports(metrics)), data())


def test_a_metric_function_giving_a_string_is_named():
    trainer = st.Trainer(loss=F.cross_entropy, metrics={"acc": lambda out, y: "high"})
    with pytest.raises(TypeError, match=r"metric 'acc' gave 'high' \(str\), not a number"):
        trainer.evaluate(Graph.somatize(Linear()), data())


def _notes(e: pytest.ExceptionInfo) -> str:
    return "\n".join(getattr(e.value, "__notes__", ()))


def test_a_metric_function_of_the_wrong_shape_is_named_with_how_it_is_called():
    # a newcomer's metric of the output alone: Python only says "takes 1 positional argument"
    trainer = st.Trainer(loss=F.cross_entropy, metrics={"mean": lambda out: out.mean()})
    with pytest.raises(TypeError, match="positional argument") as e:
        trainer.evaluate(Graph.somatize(Linear()), data())
    assert re.search(
        r"raised in metric 'mean', called as fn\(output, target\) with output float32 "
        r"\(8, 2\), target int64 \(8,\)",
        _notes(e),
    )


class Heads(nn.Module):
    """A model whose output is a dict, as a multi-head (or Hugging Face) model's is."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return {"logits": self.lin(x), "score": x.sum(-1)}


def test_a_metric_object_failing_on_a_dict_output_is_named_with_the_pick_that_fixes_it():
    from torchmetrics.classification import MulticlassAccuracy

    def loss(out, y):
        return F.cross_entropy(out["logits"], y)

    trainer = st.Trainer(loss=loss, metrics={"tm": MulticlassAccuracy(num_classes=2)})
    with pytest.raises(AttributeError) as e:  # torchmetrics: 'dict' object has no attribute
        trainer.evaluate(Heads(), data())
    notes = _notes(e)
    assert "raised in metric 'tm', called as tm.update(output, target) with output" in notes
    assert "a dict ('logits', 'score'), and a metric is given it whole" in notes
    assert "super().update(out['logits'], y)" in notes

    class Picked(MulticlassAccuracy):  # the fix the note gives
        def update(self, out, y):
            super().update(out["logits"], y)

    got = st.Trainer(
        loss=loss,
        metrics={
            "tm": Picked(num_classes=2, average="micro"),
            "acc": lambda out, y: st.accuracy(out["logits"], y),
        },
    ).evaluate(Heads(), data())
    x, y = (torch.cat(t) for t in zip(*data()))
    with torch.no_grad():  # batches of 8, 8, 3: the values over the 19 examples
        logits = Heads()(x)["logits"]
    whole = st.accuracy(logits, y).item()
    assert got["tm"] == pytest.approx(whole) and got["acc"] == pytest.approx(whole)
    assert got["loss"] == pytest.approx(F.cross_entropy(logits, y).item())


def test_a_validation_pair_of_tensors_is_named_as_two_batches():
    # val=(X, Y) is a sequence of two batches, X and Y — as fit((X, Y)) is
    x, y = data()[0]
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(TypeError) as e:
        trainer.fit(Graph.somatize(Linear()), data(), val=(x, y))
    hint = (
        r"a pair \(X, Y\) \(val=\(X, Y\) or evaluate\(g, \(X, Y\)\)\), which is a sequence of two"
    )
    assert re.search(hint, _notes(e))
    with pytest.raises(TypeError) as e:
        trainer.evaluate(Graph.somatize(Linear()), (x, y))
    assert re.search(hint, _notes(e))


def test_a_metric_named_as_a_node_metric_is_refused_not_overwritten():
    # "linear/mean" is also what the node Linear reports: one of the two values would be lost
    trainer = st.Trainer(loss=F.cross_entropy, metrics={"linear/mean": st.accuracy})
    g = Graph.somatize(Linear())
    with pytest.raises(SettingError, match=r"metric .linear/mean..*node .linear..*; rename"):
        trainer.evaluate(g, data())


@pytest.mark.parametrize("name", ["", " "])
def test_a_blank_metric_name_is_refused(name):
    with pytest.raises(SettingError, match=r"metric name .* blank"):
        st.Trainer(loss=F.cross_entropy, metrics={name: st.accuracy})


def test_a_metric_name_not_a_string_and_evaluation_data_without_batches_are_named():
    with pytest.raises(
        SettingError, match=r"names must be strings, not 3 \(int\); e\.g\. metrics="
    ):
        st.Trainer(loss=F.cross_entropy, metrics={3: st.accuracy})
    with pytest.raises(ValueError, match=r"yielded no batches \(an empty list.*pass at least one"):
        st.Trainer(loss=F.cross_entropy).evaluate(Graph.somatize(Linear()), [])


def test_a_metric_collection_is_evaluated_member_by_member():
    """Lightning's self.log_dict(collection): given whole, each member under its own name
    (with the collection's prefix); given under a name, as <name>_<member>."""
    torchmetrics = pytest.importorskip("torchmetrics")
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    def collection(**kw):
        return torchmetrics.MetricCollection(
            {"acc": MulticlassAccuracy(num_classes=2), "f1": MulticlassF1Score(num_classes=2)},
            **kw,
        )

    torch.manual_seed(0)
    g = Graph.somatize(Linear())
    val = data()
    whole = st.Trainer(loss=F.cross_entropy, metrics=collection()).evaluate(g, val)
    named = st.Trainer(loss=F.cross_entropy, metrics={"cls": collection(), "a": st.accuracy})
    got = named.evaluate(g, val)
    prefixed = st.Trainer(loss=F.cross_entropy, metrics=collection(prefix="m_")).evaluate(g, val)
    net = g["linear"].lin
    with torch.no_grad():
        pred = torch.cat([net(x).argmax(-1) for x, _ in val])
    ys = torch.cat([y for _, y in val])
    macro_acc = sum(float((pred[ys == c] == c).float().mean()) for c in (0, 1)) / 2
    assert list(whole) == ["loss", "acc", "f1", "linear/mean"]
    assert whole["f1"] == pytest.approx(f1_by_hand(pred, ys))
    assert whole["acc"] == pytest.approx(macro_acc)
    assert list(got) == ["loss", "cls_acc", "cls_f1", "a", "linear/mean"]
    assert (got["cls_acc"], got["cls_f1"]) == (whole["acc"], whole["f1"])
    assert list(prefixed)[1:3] == ["m_acc", "m_f1"]
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"cls": collection()},
        options=st.Options(progress=False, monitor="val_cls_f1", mode="max"),
    ).fit(Graph.somatize(Linear()), data(), val=data())
    assert {"val_cls_acc", "val_cls_f1"} <= set(result.metrics[-1])


def test_a_metric_giving_several_numbers_names_one_entry_per_number():
    with pytest.raises(TypeError) as caught:
        st.Trainer(loss=F.cross_entropy, metrics={"d": lambda o, y: {"a": 1.0, "b": 2.0}}).evaluate(
            Graph.somatize(Linear()), data()
        )
    message = str(caught.value)
    assert "metric 'd' gave {'a': 1.0, 'b': 2.0} (dict), not a number" in message
    assert "give each its own entry, metrics={'a': ..., 'b': ...}" in message


class TwoMetrics(Node):
    """A node reporting a float32 tensor and a Python float as its metrics."""

    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(Opaque(out), metrics={"mean": out.detach().mean(), "third": 0.1 + len(x) / 3})


def test_cpu_evaluation_sums_in_float64_as_a_plain_loop_does():
    """Every value is sum(float64(batch value) * n) / sum(n) in batch order, bitwise: the
    loss, a float32, a bfloat16 and a Python-number metric, and a node's tensor and float
    metrics (a node's float was rounded to float32 once: 3.57619040... for 3.57619047...)."""
    torch.manual_seed(0)
    g = Graph.somatize(TwoMetrics())
    gen = torch.Generator().manual_seed(1)
    val = [
        (torch.randn(n, 3, generator=gen), torch.randint(0, 2, (n,), generator=gen))
        for n in [7, 13, 1, 5]
    ]
    fns = {
        "acc": st.accuracy,
        "bf": lambda out, y: out.bfloat16().std(),
        "py": lambda out, y: 0.1 * len(y),
    }
    got = st.Trainer(loss=F.cross_entropy, metrics=fns).evaluate(g, val)
    m = st.module(g)
    sums = dict.fromkeys(got, 0.0)
    with torch.no_grad():
        for x, y in val:
            out = m(x)
            batch = {"loss": F.cross_entropy(out, y), **{k: f(out, y) for k, f in fns.items()}}
            batch |= {f"two_metrics/{k}": v for k, v in m.metrics["two_metrics"].items()}
            for k, v in batch.items():
                sums[k] += float(v) * len(x)
    assert got == {k: s / 26 for k, s in sums.items()}


def test_cpu_evaluation_adds_no_tensor_op_per_batch_to_sum_its_values():
    """The sums are Python floats on the CPU: the float64 tensor ops an evaluation makes (the
    final tensor of sums) do not grow with its batches (they were three per batch and value)."""
    from torch.overrides import TorchFunctionMode

    class Float64Ops(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float64:
                self.count += 1
            return out

    torch.manual_seed(0)
    g = Graph.somatize(TwoMetrics())
    # a float32 metric of its own: st.accuracy computes in float64 (one op per batch)
    hits = {"acc": lambda out, y: (out.argmax(-1) == y).float().mean()}
    trainer = st.Trainer(loss=F.cross_entropy, metrics=hits)
    counts = []
    for batches in (3, 9):
        val = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(batches)]
        with Float64Ops() as ops:
            trainer.evaluate(g, val)
        counts.append(ops.count)
    assert counts[0] == counts[1]
