"""first_step.py: gradient reach checked once, and a first step's failure explained."""

from __future__ import annotations

import collections
import dataclasses
import re
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

torch.set_num_threads(1)


class Enc(Node):
    def __init__(self, detach: bool = False) -> None:
        self.lin, self.detach = nn.Linear(3, 4), detach

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(out.detach() if self.detach else Opaque(out))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


def data(n=3):
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(n)
    ]


def graph(detach=False):
    return Graph.somatize(Enc(detach).with_id("enc") >> Head().with_id("head"))


Q = st.Options(progress=False, sanity_val_batches=0)


@pytest.mark.parametrize("options", [Q, st.Options(progress=False, accumulate=2)])
def test_a_detached_node_output_is_named_once_by_its_parameters(options):
    g = graph(detach=True)
    before = g["enc"].lin.weight.detach().clone()
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=2, options=options)
    with pytest.warns(UserWarning, match=r"2 trainable parameters got no gradient") as caught:
        result = trainer.fit(g, data(4))
    found = [w for w in caught if "got no gradient" in str(w.message)]
    assert len(found) == 1  # the first step only, not every step
    assert "node 'enc' (enc.lin.weight, enc.lin.bias)" in str(found[0].message)
    assert "head" not in str(found[0].message)
    assert result.steps == (8 if options.accumulate == 1 else 4)
    assert torch.equal(g["enc"].lin.weight, before)  # what the warning says: it did not train


def test_a_loss_that_ignores_the_output_is_warned_about():
    g = graph()
    trainer = st.Trainer(
        loss=lambda out, y: torch.ones((), requires_grad=True), optimizer=sgd, options=Q
    )
    with pytest.warns(UserWarning, match=r"4 trainable parameters.*node 'enc'.*node 'head'"):
        trainer.fit(g, data())


def test_a_model_the_loss_reaches_everywhere_warns_nothing_and_trains_as_before():
    g = graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, epochs=2, options=Q).fit(g, data())
    assert all(p.grad is not None for p in st.parameters(g))


def test_the_check_leaves_no_hook_on_the_optimizer():
    made = []

    def factory(ps):
        made.append(torch.optim.SGD(ps, lr=0.1))
        return made[-1]

    st.Trainer(loss=F.cross_entropy, optimizer=factory, options=Q).fit(graph(), data())
    assert len(made[0]._optimizer_step_pre_hooks) == 0


class Weighted(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


@pytest.mark.parametrize(
    ("batch", "shape"),
    [
        ((torch.randn(4, 3), torch.randint(0, 2, (4,)), torch.ones(4)), r"a tuple of 3"),
        ({"image": torch.randn(4, 3), "label": torch.randint(0, 2, (4,))}, r"a dict \{'image'"),
    ],
)
@pytest.mark.parametrize("options", [Q, st.Options(progress=False, accumulate=2)])
def test_a_batch_that_is_not_split_fails_with_a_note_naming_its_structure_and_the_rule(
    batch, shape, options
):
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=options)
    with pytest.raises(TypeError) as info:
        trainer.fit(Graph.somatize(Weighted()), [batch, batch])
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert re.search(shape, notes), notes
    assert "a batch is (x, y) or a dict with 'x'" in notes
    assert "loss(output)" in notes


class Tokens(Node):
    """A classifier over a tokenizer's batch: ``{"input_ids", "attention_mask"}``."""

    def __init__(self) -> None:
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, batch, ctx):
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (self.emb(batch["input_ids"]) * mask).sum(1) / mask.sum(1)
        return Done(Opaque(self.out(pooled)))


def test_a_tokenizer_style_dict_is_told_the_split_that_takes_its_labels_out_and_it_works():
    gen = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, 10, (4, 6), generator=gen),
        "attention_mask": torch.ones(4, 6, dtype=torch.long),
        "labels": torch.randint(0, 2, (4,), generator=gen),
    }
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=Q)
    with pytest.raises(TypeError) as info:
        trainer.fit(Graph.somatize(Tokens()), [batch, batch])
    notes = "".join(info.value.__notes__)
    told = "split=lambda b: ({k: v for k, v in b.items() if k != 'labels'}, b['labels'])"
    assert told in notes, notes
    assert "a dict of the other keys ('input_ids', 'attention_mask')" in notes
    split = eval(told.removeprefix("split="))  # the fix as the note gives it
    result = st.Trainer(loss=F.cross_entropy, optimizer=sgd, split=split, options=Q).fit(
        Graph.somatize(Tokens()), [batch, batch]
    )
    assert result.steps == 2


@dataclasses.dataclass
class Example:
    image: torch.Tensor
    label: torch.Tensor
    key: str


Triple = collections.namedtuple("Triple", "image mask label")


@pytest.mark.parametrize("make", [lambda x, y: Example(x, y, "k"), lambda x, y: Triple(x, x, y)])
def test_a_dataclass_or_namedtuple_batch_is_told_the_split_by_its_field_names(make):
    """Not b[0] (a dataclass has no indices): the fields by name, the target's picked out."""
    batch = make(torch.randn(4, 3), torch.randint(0, 2, (4,)))
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=Q)
    with pytest.raises(TypeError) as info:
        trainer.fit(Graph.somatize(Weighted()), [batch, batch])
    notes = "".join(info.value.__notes__)
    assert f"a {type(batch).__name__}(image=tensor (4, 3)" in notes, notes
    told = "split=lambda b: (b.image, b.label)"
    assert told in notes, notes
    split = eval(told.removeprefix("split="))  # the fix as the note gives it
    result = st.Trainer(loss=F.cross_entropy, optimizer=sgd, split=split, options=Q).fit(
        Graph.somatize(Weighted()), [batch, batch]
    )
    assert result.steps == 2


def test_fit_given_a_pair_of_tensors_is_told_it_is_two_batches():
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=Q)
    with pytest.raises(TypeError) as info:
        trainer.fit(Graph.somatize(Weighted()), (x, y))
    assert "fit() was given a pair (X, Y), which is a sequence of two batches" in "".join(
        info.value.__notes__
    )


def test_a_pair_fed_whole_without_a_loss_is_told_to_pass_loss():
    trainer = st.Trainer(optimizer=sgd, options=Q)
    with pytest.raises(TypeError) as info:
        trainer.fit(Graph.somatize(Weighted()), data())
    assert "without loss= the graph gets the whole batch" in "".join(info.value.__notes__)


@pytest.mark.parametrize(
    "loss",
    [
        lambda out, y: (out.argmax(1) == y).sum(),  # an int count
        lambda out, y: F.cross_entropy(out.detach(), y),  # no grad
    ],
)
def test_a_loss_without_grad_is_named_on_the_first_step(loss):
    trainer = st.Trainer(loss=loss, optimizer=sgd, options=Q)
    with pytest.raises(RuntimeError) as info:
        trainer.fit(Graph.somatize(Weighted()), data())
    notes = "".join(info.value.__notes__)
    assert "the loss function" in notes and "<lambda>" in notes
    assert "does not require grad" in notes


@pytest.mark.parametrize("options", [Q, st.Options(progress=False, accumulate=2)])
@pytest.mark.parametrize(
    "loss, raised",
    [
        (F.cross_entropy, RuntimeError),  # a float target: torch names no loss
        (lambda out: out.sum(), TypeError),  # one argument, called with two
    ],
    ids=["float-target", "one-argument"],
)
def test_a_loss_that_fails_on_the_first_step_is_named_with_what_it_was_given(options, loss, raised):
    floats = [(x, y.float()) for x, y in data()]
    with pytest.raises(raised) as info:
        st.Trainer(loss=loss, optimizer=sgd, options=options).fit(graph(), floats)
    notes = "".join(info.value.__notes__)
    assert "raised in the loss function" in notes
    assert "called as loss(output, target) with output float32 (4, 2), target float32 (4,)" in notes


def test_a_model_that_fails_is_not_said_to_be_the_loss():
    class Broken(Node):
        def forward(self, x, ctx):
            raise ValueError("the model's own failure")

    with pytest.raises(ValueError, match="the model's own failure") as info:
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=Q).fit(
            Graph.somatize(Broken() >> Head()), data()
        )
    assert "raised in the loss" not in "".join(getattr(info.value, "__notes__", []))


class KeywordModel(nn.Module):
    """A model whose forward takes a tokenizer's keys as parameters, as a Hugging Face one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = nn.Embedding(10, 4), nn.Linear(4, 2)

    def forward(self, input_ids, attention_mask):
        return self.out((self.emb(input_ids) * attention_mask[..., None]).mean(1))


class Unpacked(nn.Module):  # the wrapper the note gives
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, inputs):
        return self.m(**inputs)


def test_a_dict_input_to_a_model_of_keyword_parameters_is_told_it_is_one_argument():
    gen = torch.Generator().manual_seed(0)
    batches = [
        {
            "input_ids": torch.randint(0, 10, (4, 6), generator=gen),
            "attention_mask": torch.ones(4, 6),
            "labels": torch.randint(0, 2, (4,), generator=gen),
        }
        for _ in range(3)
    ]
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        split=lambda b: ({k: v for k, v in b.items() if k != "labels"}, b["labels"]),
        options=st.Options(progress=False, shuffle=False),
    )
    with pytest.raises(TypeError) as info:
        trainer.fit(KeywordModel(), batches)
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "its forward takes input_ids, attention_mask as parameters" in notes, notes
    assert "not model(**inputs)" in notes
    wrapped = Unpacked(KeywordModel())
    trainer.fit(wrapped, batches)
    plain = KeywordModel()  # the same steps by hand
    opt = sgd(plain.parameters())
    for b in batches:
        opt.zero_grad()
        F.cross_entropy(plain(b["input_ids"], b["attention_mask"]), b["labels"]).backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(wrapped.m.parameters(), plain.parameters()))
    for call in (trainer.evaluate, trainer.predict):  # (fit's first step only, before)
        with pytest.raises(TypeError) as info:
            call(KeywordModel(), batches)
        notes = "".join(getattr(info.value, "__notes__", []))
        assert "its forward takes input_ids, attention_mask as parameters" in notes, call


def test_a_float64_model_on_float32_data_gets_a_note_naming_both_dtypes():
    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    with pytest.raises(RuntimeError) as e:
        trainer.fit(nn.Linear(4, 3).double(), data)  # (torch's bare 'mat1 and mat2 ...')
    said = " ".join(getattr(e.value, "__notes__", []))
    assert "the model's parameters are float64 and the batch's inputs float32" in said
    assert "x.to(torch.float64)" in said and "model.to(torch.float32)" in said
    doubled = [(x.double(), y) for x, y in data]  # the fix it gives trains
    assert trainer.fit(nn.Linear(4, 3).double(), doubled).losses
