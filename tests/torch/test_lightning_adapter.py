"""LightningGraph, the adapter: a LightningModule holding the graph's weights, trained,
tested and predicting under the real lightning.Trainer (CPU, tiny data), with metric
objects, carried state, and the errors it raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

L = pytest.importorskip("lightning")


import somatize.torch as st  # noqa: E402
from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.torch.lightning import LightningGraph  # noqa: E402
from tests.torch.lightning_graphs import (  # noqa: E402
    SGD,
    _assert_same_state,
    _graph,
    _lg,
    _loader,
    _tensors,
    _trainer,
)
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    NO_VAL,  # fitting without validation data is a normal run here, as in the Trainer
]


# -- the adapter ------------------------------------------------------------------------


def test_lightning_graph_is_a_lightning_module_holding_the_graph_weights():
    g = _graph()
    lg = _lg(g)
    assert isinstance(lg, L.LightningModule)
    assert lg.net is st.module(g)
    assert sorted(lg.state_dict()) == sorted(f"net.{k}" for k in st.state(g))
    x, _ = _tensors(4)
    torch.testing.assert_close(lg(x), st.module(g)(x))
    assert lg.hparams["topology"] == g.topology.to_json()
    assert lg.hparams["loss_name"] == "cross_entropy"
    assert (lg.hparams["optimizer_name"], lg.hparams["lr"]) == ("SGD", SGD)
    assert lg.hparams["metric_names"] == ["acc"]
    assert lg.hparams["scheduler_name"] is None
    scheduled = _lg(g, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1))
    assert scheduled.hparams["scheduler_name"] == "StepLR"
    with pytest.raises(TypeError, match="factory over parameters"):
        LightningGraph(
            g, loss=None, optimizer=torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1)
        )


def test_a_module_instead_of_a_graph_is_told_how_to_make_it_one(tmp_path):
    """An nn.Module: st.Trainer takes it as it is, or it becomes a graph's one node — and
    the node the message shows trains it under lightning.Trainer."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    with pytest.raises(TypeError) as caught:
        LightningGraph(model, loss=nn.functional.cross_entropy)
    message = str(caught.value)
    assert message.startswith("LightningGraph takes a somatize Graph, got Sequential, an nn.Module")
    assert ".fit(model, train)" in message
    assert "LightningGraph(Graph.somatize(Model(model)), loss=..., optimizer=...)" in message
    shown = "\n".join(line[4:] for line in message.splitlines() if line.startswith("    "))
    from somatize import Done, Graph, Node, Opaque

    scope = {"Done": Done, "Graph": Graph, "Node": Node, "Opaque": Opaque, "model": model}
    exec(shown.split("\nLightningGraph(")[0], scope)  # the class as the message writes it
    before = model[0].weight.detach().clone()
    lg = LightningGraph(
        Graph.somatize(scope["Model"](model)),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
    )
    _trainer(tmp_path, max_epochs=1).fit(lg, _loader())
    assert not torch.equal(model[0].weight, before)  # the module's own weights trained
    with pytest.raises(TypeError, match=r"got a GraphModule \(st.module\(g\)\): pass the graph"):
        LightningGraph(st.module(_graph()), loss=nn.functional.cross_entropy)


def test_training_reduces_the_loss(tmp_path):
    lg = _lg(_graph())
    trainer = _trainer(tmp_path, max_epochs=4)
    trainer.fit(lg, _loader(), _loader(seed=1))
    assert len(lg.losses) == trainer.global_step == 16
    assert [r["epoch"] for r in lg.history] == [0, 1, 2, 3]
    assert lg.history[-1]["val_loss"] < lg.history[0]["val_loss"]
    assert sum(lg.losses[-4:]) < sum(lg.losses[:4])
    assert trainer.callback_metrics["val_loss"] == pytest.approx(
        lg.history[-1]["val_loss"], rel=1e-5
    )


class _Dicts(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


def test_dict_batches_train_like_tuples(tmp_path):
    tuples, dicts = _lg(_graph()), _lg(_graph())
    _trainer(tmp_path, max_epochs=1).fit(tuples, _loader())
    _trainer(tmp_path, max_epochs=1).fit(dicts, DataLoader(_Dicts(*_tensors()), batch_size=16))
    _assert_same_state(st.state(tuples.graph), st.state(dicts.graph))


def test_test_and_predict_steps(tmp_path):
    lg = _lg(_graph())
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(lg, _loader())
    (tested,) = trainer.test(lg, _loader(seed=1), verbose=False)
    assert {"test_loss", "test_acc", "test_hidden/mean"} <= set(tested)
    assert 0.0 <= tested["test_acc"] <= 1.0
    predicted = trainer.predict(lg, _loader(seed=1))
    assert [p.shape for p in predicted] == [torch.Size([16, 3])] * 4
    x, _ = _tensors(64, seed=1)
    torch.testing.assert_close(torch.cat(predicted), st.module(lg.graph)(x))


def test_a_node_metric_that_is_not_a_scalar_is_an_error_naming_the_node(tmp_path):
    class Wide(Node):
        def __init__(self):
            self.lin = nn.Linear(8, 3)

        def forward(self, x, ctx):
            y = self.lin(x)
            return Done(Opaque(y), metrics={"logits": y.detach()})

    lg = _lg(Graph.somatize(Wide()))
    with pytest.raises(TypeError, match="node 'wide' metric 'logits'"):
        _trainer(tmp_path, max_steps=1).fit(lg, _loader())


def test_a_metric_object_is_computed_over_the_whole_validation_set(tmp_path):
    torchmetrics = pytest.importorskip("torchmetrics")
    f1 = torchmetrics.classification.MulticlassF1Score(num_classes=3, average="macro")
    g = _graph()
    lg = LightningGraph(
        g,
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"f1": f1},
    )
    val = _loader(seed=1)
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(lg, _loader(), val)
    ref = torchmetrics.classification.MulticlassF1Score(num_classes=3, average="macro")
    with torch.no_grad():
        for x, y in val:
            ref.update(st.module(g)(x), y)
    assert lg.history[-1]["val_f1"] == pytest.approx(float(ref.compute()))
    assert float(trainer.callback_metrics["val_f1"]) == pytest.approx(float(ref.compute()))


def test_a_metric_collection_is_logged_member_by_member(tmp_path):
    """As self.log_dict(collection) in a LightningModule: each member under its name."""
    torchmetrics = pytest.importorskip("torchmetrics")
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    both = torchmetrics.MetricCollection(
        {"acc": MulticlassAccuracy(num_classes=3), "f1": MulticlassF1Score(num_classes=3)}
    )
    g = _graph()
    lg = LightningGraph(
        g,
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics=both,
    )
    val = _loader(seed=1)
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(lg, _loader(), val)
    ref = MulticlassF1Score(num_classes=3)
    with torch.no_grad():
        for x, y in val:
            ref.update(st.module(g)(x), y)
    assert {"val_acc", "val_f1"} <= set(lg.history[-1])
    assert lg.history[-1]["val_f1"] == pytest.approx(float(ref.compute()))
    assert float(trainer.callback_metrics["val_f1"]) == pytest.approx(float(ref.compute()))


def test_carried_state_is_reset_at_each_epoch_and_validation_start(tmp_path):
    from somatize import Done, Node, Opaque

    class Recurrent(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(8, 3)
            self.hidden = st.Carry()
            self.starts: list[tuple[bool, bool]] = []

        def forward(self, x, ctx):
            self.starts.append((ctx.training, self.hidden.value is None))
            out = self.lin(x)
            self.hidden.set(out)
            return Done(Opaque(out))

    node = Recurrent()
    lg = LightningGraph(
        Graph.somatize(node),
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
    )
    _trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0).fit(lg, _loader(), _loader(seed=1))
    train_starts = [fresh for training, fresh in node.starts if training]
    val_starts = [fresh for training, fresh in node.starts if not training]
    assert train_starts.count(True) == 2  # once per epoch
    assert val_starts.count(True) == 2  # once per validation
    assert train_starts[4] is True and not any(train_starts[1:4])


def test_a_loss_class_is_refused_when_made_naming_the_instance_and_the_function():
    from somatize.errors import SettingError

    with pytest.raises(
        SettingError,
        match=r"class CrossEntropyLoss.*CrossEntropyLoss\(\) or "
        r"F.cross_entropy",
    ):
        LightningGraph(
            _graph(), loss=nn.CrossEntropyLoss, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)
        )
