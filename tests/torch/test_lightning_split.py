"""LightningGraph(split=): batches of another form than (x, y), against a plain LightningModule,
with the checks and errors of st.Trainer(split=)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

L = pytest.importorskip("lightning")

import somatize.torch as st  # noqa: E402
from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.errors import SettingError  # noqa: E402
from somatize.torch.lightning import LightningGraph  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = QUIET


class Net(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Pair(Node):
    """Two inputs, as a model with forward(x1, x2) takes them."""

    def __init__(self) -> None:
        self.a, self.b = nn.Linear(4, 3), nn.Linear(2, 3)

    def forward(self, x, ctx):
        x1, x2 = x
        return Done(Opaque(self.a(x1) + self.b(x2)))


class Rows(Dataset):
    """Hugging Face style rows: dicts whose keys are not x and y."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x, self.x2 = torch.randn(n, 4, generator=gen), torch.randn(n, 2, generator=gen)
        self.y = torch.randint(0, 3, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return {"input": self.x[i], "extra": self.x2[i], "labels": self.y[i]}


def by_keys(b):
    return b["input"], b["labels"]


def graph(node=Net) -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(node().with_id("net"))


def lightning(**kw) -> L.Trainer:
    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    return L.Trainer(**{**settings, **kw})


class Plain(L.LightningModule):
    """The graph's module under a LightningModule that splits the batch itself."""

    def __init__(self, net: nn.Module, split) -> None:
        super().__init__()
        self.net, self.cut = net, split

    def training_step(self, batch, i):
        x, y = self.cut(batch)
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, i):
        x, y = self.cut(batch)
        self.log("val_loss", F.cross_entropy(self.net(x), y), batch_size=len(y))

    def test_step(self, batch, i):
        x, y = self.cut(batch)
        self.log("test_loss", F.cross_entropy(self.net(x), y), batch_size=len(y))

    def predict_step(self, batch, i):
        return self.net(self.cut(batch)[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def both(split, node=Net, **kw):
    """The same run twice: a LightningGraph with split=, and a plain module splitting itself."""
    train, val = DataLoader(Rows(40, 0), batch_size=8), DataLoader(Rows(14, 1), batch_size=8)
    g = graph(node)
    lg = LightningGraph(
        g, loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5), split=split
    )
    plain = Plain(st.module(graph(node)), split)
    runs = []
    for m in (lg, plain):
        t = lightning(max_epochs=2, **kw)
        t.fit(m, train, val)
        runs.append(t)
    return lg, plain, runs, val


def test_dict_batches_split_by_a_function_train_validate_test_and_predict_as_a_plain_module():
    lg, plain, (t_graph, t_plain), val = both(by_keys)
    assert t_graph.global_step == t_plain.global_step == 10
    for name, value in plain.net.state_dict().items():
        assert torch.equal(lg.net.state_dict()[name], value), name
    want = float(t_plain.callback_metrics["val_loss"])
    assert lg.history[-1]["val_loss"] == pytest.approx(want, rel=1e-6)
    tested = [lightning().test(m, val, verbose=False)[0]["test_loss"] for m in (lg, plain)]
    assert tested[0] == pytest.approx(tested[1], rel=1e-6)
    got, outs = (lightning().predict(m, val) for m in (lg, plain))
    assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, outs))


def test_a_batch_becomes_two_inputs_and_a_target_with_accumulation():
    def triple(b):
        return (b["input"], b["extra"]), b["labels"]

    lg, plain, _, _ = both(triple, Pair, accumulate_grad_batches=2)
    for name, value in plain.net.state_dict().items():
        assert torch.equal(lg.net.state_dict()[name], value), name


def test_a_split_that_is_not_a_pair_or_has_no_loss_is_refused_as_by_the_trainer():
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    lg = LightningGraph(
        graph(), loss=F.cross_entropy, optimizer=sgd, split=lambda b: [b["input"], b["labels"]]
    )
    with pytest.raises(SettingError, match=r"returned list, not an \(inputs, target\) pair"):
        lightning(max_epochs=1).fit(
            lg, DataLoader(Rows(8, 0), batch_size=4), DataLoader(Rows(4, 1))
        )
    with pytest.raises(SettingError, match="the LightningGraph has no loss="):
        LightningGraph(graph(), loss=None, optimizer=sgd, split=by_keys)
    with pytest.raises(SettingError, match="split must be a function of a batch"):
        LightningGraph(graph(), loss=F.cross_entropy, optimizer=sgd, split="labels")


def _note(e: pytest.ExceptionInfo) -> str:
    (note,) = [n for n in getattr(e.value, "__notes__", ()) if "does not split" in n]
    return note


def test_dict_batches_without_split_get_the_trainers_note_naming_the_layout_and_the_fix():
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    rows = DataLoader(Rows(8, 0), batch_size=4)
    with pytest.raises(TypeError, match="must be Tensor, not dict") as own:
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=1).fit(graph(), rows)
    # training, a validation alone, a test: each names the batch and LightningGraph(split=)
    runs = {
        "fit": lambda lg: lightning(max_epochs=1).fit(lg, rows, rows),
        "validate": lambda lg: lightning().validate(lg, rows, verbose=False),
        "test": lambda lg: lightning().test(lg, rows, verbose=False),
    }
    for how, run in runs.items():
        lg = LightningGraph(graph(), loss=F.cross_entropy, optimizer=sgd)
        with pytest.raises(TypeError, match="must be Tensor, not dict") as e:
            run(lg)
        note = _note(e)
        assert "the batch is a dict {'input': tensor (4, 4), 'extra': tensor (4, 2)" in note, how
        assert (
            "LightningGraph(split=lambda b: ({k: v for k, v in b.items() if k != 'labels'}, "
            "b['labels']))" in note
        ), how
        assert "a dict of the other keys ('input', 'extra')" in note, how
        # the Trainer's words for the same batch, the class named aside
        assert note == _note(own).replace("Trainer", "LightningGraph"), how


class Twice(Node):
    """A model whose output is a tuple, which F.cross_entropy does not take."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(Opaque((out, out)))


@NO_VAL
def test_a_loss_that_fails_on_the_output_gets_the_trainers_note_naming_its_structure():
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    x, y = torch.randn(4, 4), torch.randint(0, 3, (4,))
    quiet = st.Options(progress=False)
    with pytest.raises(TypeError, match="must be Tensor, not tuple") as own:
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet).fit(graph(Twice), [(x, y)])
    (trainers,) = [n for n in own.value.__notes__ if "raised in the loss function" in n]
    assert "output (tensor (4, 3), tensor (4, 3)), target int64 (4,)" in trainers
    rows = DataLoader(TensorDataset(x, y), batch_size=4)
    runs = {
        "fit": lambda lg: lightning(max_epochs=1).fit(lg, rows),
        "validate": lambda lg: lightning().validate(lg, rows, verbose=False),
    }
    for how, run in runs.items():
        lg = LightningGraph(graph(Twice), loss=F.cross_entropy, optimizer=sgd)
        with pytest.raises(TypeError, match="must be Tensor, not tuple") as e:
            run(lg)
        notes = [n for n in e.value.__notes__ if "raised in the loss function" in n]
        assert notes == [trainers.replace("the Trainer", "LightningGraph")], how
