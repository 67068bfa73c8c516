"""Trainer(split=): batches of another form than (x, y), against a plain loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError
from somatize.watchers import Recorder


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


def dict_batches(n: int = 5):
    """Hugging Face style: a dict whose keys are not x and y."""
    gen = torch.Generator().manual_seed(0)
    return [
        {
            "input": torch.randn(8, 4, generator=gen),
            "labels": torch.randint(0, 3, (8,), generator=gen),
        }
        for _ in range(n)
    ]


def by_keys(b):
    return b["input"], b["labels"]


def trainer(**kw) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        epochs=2,
        options=st.Options(progress=False, shuffle=False, sanity_val_batches=0),
        **kw,
    )


def graph(node=Net) -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(node().with_id("net"))


@pytest.mark.parametrize("watched", [False, True], ids=["fast path", "step path"])
def test_dict_batches_split_by_a_function_train_as_a_plain_loop(watched):
    g = graph()
    model = copy.deepcopy(st.module(g))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    want = []
    for _ in range(2):
        for b in dict_batches():
            opt.zero_grad()
            loss = F.cross_entropy(model(b["input"]), b["labels"])
            loss.backward()
            opt.step()
            want.append(loss.item())
    watchers = [Recorder()] if watched else []
    result = trainer(split=by_keys, watchers=watchers).fit(g, dict_batches())
    assert result.losses == want
    for name, value in model.state_dict().items():
        assert torch.equal(result.state[name], value), name


def test_evaluate_and_predict_split_the_same_way():
    g, val = graph(), dict_batches(2)
    t = trainer(split=by_keys, metrics={"acc": st.accuracy})
    t.fit(g, dict_batches(), val=val)
    m = st.module(g).eval()
    with torch.no_grad():
        want = sum(F.cross_entropy(m(b["input"]), b["labels"]).item() * 8 for b in val) / 16
        outs = [m(b["input"]) for b in val]
    assert t.evaluate(g, val)["loss"] == pytest.approx(want, rel=1e-6)
    got = t.predict(g, val)
    assert all(torch.equal(a, b) for a, b in zip(got, outs))


def test_a_triple_becomes_two_inputs_and_a_target_with_accumulation():
    gen = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(6, 4, generator=gen), torch.randn(6, 2, generator=gen),
         torch.randint(0, 3, (6,), generator=gen))
        for _ in range(4)
    ]  # fmt: skip
    g = graph(Pair)
    model = copy.deepcopy(st.module(g))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for i in range(0, 4, 2):  # accumulate=2: equal batches, each half of the step
        opt.zero_grad()
        for x1, x2, y in data[i : i + 2]:
            (F.cross_entropy(model((x1, x2)), y) / 2).backward()
        opt.step()
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        split=lambda b: ((b[0], b[1]), b[2]),
        options=st.Options(progress=False, shuffle=False, accumulate=2, sanity_val_batches=0),
    ).fit(g, data)
    assert result.steps == 2
    for name, value in model.state_dict().items():
        torch.testing.assert_close(result.state[name], value, rtol=1e-6, atol=1e-7)


def test_a_split_that_is_not_a_pair_or_has_no_loss_is_refused():
    with pytest.raises(SettingError, match=r"returned list of|not an \(inputs, target\) pair"):
        trainer(split=lambda b: [b["input"], b["labels"]]).fit(graph(), dict_batches())
    with pytest.raises(SettingError, match="split= gives a loss function its target"):
        st.Trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), split=by_keys)
    with pytest.raises(SettingError, match="split must be a function of a batch"):
        trainer(split="labels")


def test_a_split_that_raises_says_what_batch_it_was_given():
    # a dict batch without "labels" raised a bare KeyError('labels'), naming nothing
    batches = [{"input": b["input"]} for b in dict_batches()]
    with pytest.raises(KeyError, match="labels") as e:
        trainer(split=by_keys).fit(graph(), batches)
    (note,) = [n for n in e.value.__notes__ if "raised by split=" in n]
    assert "split='by_keys', given a dict with the keys 'input'" in note
    with pytest.raises(IndexError) as e:
        trainer(split=lambda b: (b[0], b[2])).evaluate(graph(), [(torch.zeros(2, 4),) * 2])
    assert any("given a tuple of 2" in n for n in e.value.__notes__)
