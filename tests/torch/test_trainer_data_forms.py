"""What fit/evaluate/predict take as data: a torch Dataset of examples and a list of
DataLoaders are refused before any step, naming the data and the fix; the forms that
train keep training (data_checks.check_data)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, random_split

import somatize.torch as st
from somatize.errors import SettingError
from tests.torch.trainer_helpers import batches, make_graph, quiet


def trainer() -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), options=quiet()
    )


def tensors(n: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


class Examples(Dataset):
    """A map-style dataset of examples: (features, an int label), as torchvision's are."""

    def __init__(self, label=int) -> None:
        self.x, self.y = tensors()
        self.label = label

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        if i >= len(self):
            raise IndexError(i)
        return self.x[i], self.label(self.y[i])


class Batched(Dataset):
    """A map-style dataset whose items are batches already (10 examples each)."""

    def __init__(self) -> None:
        self.x, self.y = tensors()

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i):
        if i >= len(self):
            raise IndexError(i)
        return self.x[10 * i : 10 * i + 10], self.y[10 * i : 10 * i + 10]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(batches(3))


WRAP = r"DataLoader\(dataset, batch_size=32"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: TensorDataset(*tensors()),
            r"fit\(\)'s train is a torch Dataset \(TensorDataset\) of 30 examples \(each item "
            r"\(tensor \(4,\), tensor \(\)\)\), whose items are single examples.*"
            + WRAP
            + ", shuffle=True",
        ),
        (
            lambda: random_split(TensorDataset(*tensors()), [20, 10])[0],
            r"\(Subset\) of 20 examples",
        ),
        (
            lambda: Examples(),
            r"fit\(\)'s train is a torch Dataset \(Examples\) of 30 examples.*int\)",
        ),
        (lambda: Examples(label=lambda t: t), r"\(Examples\) of 30 examples"),  # a 0-d tensor
    ],
)
def test_a_dataset_of_examples_as_train_is_refused_before_any_step(make, match):
    g = make_graph()
    before = {k: v.clone() for k, v in st.state(g).items()}
    with pytest.raises(SettingError, match=match):
        trainer().fit(g, make())
    assert all(torch.equal(before[k], v) for k, v in st.state(g).items())  # nothing trained


def test_a_loader_that_does_not_batch_a_dataset_of_examples_is_refused():
    with pytest.raises(
        SettingError,
        match=r"train is a DataLoader with batch_size=None over a torch Dataset \(TensorDataset\)",
    ):
        trainer().fit(make_graph(), DataLoader(TensorDataset(*tensors()), batch_size=None))
    x, y = tensors()  # a TensorDataset of batches (3 of 10), read without batching: taken
    ds = TensorDataset(x.reshape(3, 10, 4), y.reshape(3, 10))
    result = trainer().fit(make_graph(), DataLoader(ds, batch_size=None))
    assert (result.steps, result.num_examples) == (3, 30)


def test_a_tensor_dataset_of_regression_rows_is_refused_too():
    # a regression target of shape (3,) per row is not 0-d, but a TensorDataset holds rows
    x, _ = tensors()
    t = st.Trainer(loss=F.mse_loss, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(SettingError, match=r"\(TensorDataset\) of 30 examples"):
        t.fit(make_graph(), TensorDataset(x, torch.randn(30, 3)))


def test_a_dataset_of_examples_as_val_evaluate_or_predict_is_refused():
    ds = TensorDataset(*tensors())
    t = trainer()
    with pytest.raises(
        SettingError, match=r"fit\(\)'s val is a torch Dataset \(TensorDataset\).*batch_size=32\)"
    ):
        t.fit(make_graph(), batches(2), val=ds)
    with pytest.raises(SettingError, match=r"val set 'c' is a torch Dataset \(TensorDataset\)"):
        t.fit(make_graph(), batches(2), val={"a": batches(1), "c": ds})
    with pytest.raises(
        SettingError, match=r"evaluate\(\)'s data is a torch Dataset \(TensorDataset\)"
    ):
        t.evaluate(make_graph(), ds)
    with pytest.raises(
        SettingError, match=r"predict\(\)'s data is a torch Dataset \(TensorDataset\)"
    ):
        t.predict(make_graph(), TensorDataset(tensors()[0]))
    with pytest.raises(SettingError, match=r"fit\(\)'s train is a torch Dataset \(TensorDataset\)"):
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            options=quiet(smoke=True),
        ).fit(make_graph(), ds)


def test_what_works_keeps_working_and_the_loader_the_error_names_counts_examples():
    x, y = tensors()
    ds = TensorDataset(x, y)
    kinds = {
        "list of batches": batches(3),
        "generator": (b for b in batches(3)),
        "DataLoader": DataLoader(ds, batch_size=10),
        "DataLoader of the examples dataset": DataLoader(Examples(), batch_size=10),
        "dataset of batches": Batched(),
        "DataLoader(batch_size=None) of it": DataLoader(Batched(), batch_size=None),
        "IterableDataset of batches": Stream(),
    }
    for name, data in kinds.items():
        result = trainer().fit(make_graph(), data)
        assert (result.steps, result.num_examples) == (3, 30), name
    t = trainer()
    assert t.evaluate(make_graph(), Batched())["loss"] > 0
    assert [p.shape for p in t.predict(make_graph(), Batched())] == [(10, 3)] * 3


def test_a_list_of_val_loaders_says_to_pass_a_dict():
    va, vb = (DataLoader(TensorDataset(*tensors(10)), batch_size=5) for _ in range(2))
    with pytest.raises(
        SettingError,
        match=r"fit\(\)'s val is a list of 2 items \(DataLoader\), but a list is read as a "
        r"sequence of batches.*val=\{'a': loader_a, 'b': loader_b\}",
    ):
        trainer().fit(make_graph(), batches(2), val=[va, vb])
    said = st.Trainer(  # what it says to do
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=quiet(monitor="val_a_loss"),
    )
    result = said.fit(make_graph(), batches(2), val={"a": va, "b": vb})
    assert {"val_a_loss", "val_b_loss"} <= set(result.metrics[-1])


def test_a_list_of_train_loaders_says_to_pass_one():
    loader = DataLoader(TensorDataset(*tensors(10)), batch_size=5)
    with pytest.raises(SettingError, match=r"train is a list of 2 items.*ConcatDataset"):
        trainer().fit(make_graph(), [loader, loader])
    with pytest.raises(SettingError, match=r"val set 'a' is a tuple of 1 items.*one data set"):
        trainer().fit(make_graph(), batches(2), val={"a": (loader,)})


@pytest.mark.parametrize("box", [list, tuple])
def test_a_list_of_single_examples_is_refused_naming_the_loader_that_batches_it(box):
    """list(zip(xs, ys)): each item one example, which nn.Linear and F.cross_entropy take
    un-batched without a complaint; so are (x, int) pairs."""
    x, y = tensors()
    for examples in (box(zip(x, y)), box((a, int(b)) for a, b in zip(x, y))):
        with pytest.raises(SettingError) as caught:
            trainer().fit(make_graph(), examples)
        message = str(caught.value)
        assert f"fit()'s train is a {box.__name__} of 30 items, each a single example" in message
        assert "DataLoader(examples, batch_size=32, shuffle=True)" in message
    with pytest.raises(SettingError, match=r"evaluate\(\)'s data is a list of 30 items, each a"):
        trainer().evaluate(make_graph(), list(zip(x, y)))
    result = trainer().fit(make_graph(), DataLoader(list(zip(x, y)), batch_size=10))  # the fix
    assert (result.steps, result.num_examples) == (3, 30)


def test_one_tensor_as_data_is_refused_before_it_is_read_row_by_row():
    """predict(g, X) would predict each row un-batched, without a complaint."""
    x, _ = tensors()
    with pytest.raises(SettingError) as caught:
        trainer().predict(make_graph(), x)
    message = str(caught.value)
    assert "predict()'s data is one tensor of shape (30, 4)" in message
    assert "each of its 30 rows would be one un-batched batch" in message
    assert "[X] for one batch, or DataLoader(TensorDataset(X), batch_size=32)" in message
    with pytest.raises(SettingError, match=r"fit\(\)'s train is one tensor .*\[\(X, Y\)\]"):
        trainer().fit(make_graph(), x)
    with pytest.raises(SettingError, match=r"evaluate\(\)'s data is one tensor"):
        trainer().evaluate(make_graph(), x)
    outputs = trainer().predict(make_graph(), [x])  # the fix: one batch
    assert [tuple(o.shape) for o in outputs] == [(30, 3)]


def test_a_generator_as_train_for_two_epochs_is_refused_before_any_step():
    """Used up by the first epoch: said before it is read (as val= is), not after an epoch
    of training; a stream bounded by max_steps, or one epoch, trains."""
    gen = (b for b in batches(3))
    with pytest.raises(SettingError) as caught:
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            options=quiet(),
        ).fit(make_graph(), gen)
    message = str(caught.value)
    assert "fit()'s train is a generator, an iterator the first epoch uses up" in message
    assert "epochs=2" in message and "list(...)" in message and "max_steps=N" in message
    assert len(list(gen)) == 3  # not a batch read
    streamed = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        max_steps=2,
        options=quiet(),
    ).fit(make_graph(), (b for b in batches(3)))
    assert streamed.steps == 2


def test_a_model_returning_a_dict_with_its_loss_is_told_to_pick_it_out():
    """A Hugging Face-style model with loss=None: the message names out['loss'], not the
    batch's split, and the fix it gives trains."""

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, batch):
            x, y = batch
            logits = self.lin(x)
            return {"loss": F.cross_entropy(logits, y), "logits": logits}

    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    with pytest.raises(SettingError) as caught:
        st.Trainer(optimizer=sgd, options=quiet()).fit(WithLoss(), batches(3))
    message = str(caught.value)
    assert message.startswith("the model returned a dict ('loss', 'logits'), not its loss")
    assert "loss=lambda out: out['loss'], split=lambda batch: (batch, None)" in message
    assert not getattr(caught.value, "__notes__", [])  # the batch's split is not at fault
    picked = st.Trainer(
        loss=lambda out: out["loss"], split=lambda batch: (batch, None), optimizer=sgd
    )
    assert picked.fit(WithLoss(), batches(3), val=batches(2)).metrics[-1]["val_loss"] > 0


def test_a_data_module_is_refused_naming_the_loader_to_pass():
    """A Lightning user's ``fit(g, dm)``: a LightningDataModule (or anything shaped as one)
    is no batches; the error names the loader of its to pass, and the ``setup`` stage
    Lightning calls before it (``fit``, ``validate``, ``predict``: not ``fit`` for all)."""

    class DataModule:  # (as LightningDataModule: loaders by method, not iterable)
        def train_dataloader(self):
            return DataLoader(TensorDataset(*tensors()), batch_size=8)

        val_dataloader = predict_dataloader = train_dataloader

    t, dm = trainer(), DataModule()
    with pytest.raises(SettingError, match=r"train is .*DataModule, a data module.*here "
                       r"dm\.train_dataloader\(\) — dm\.setup\('fit'\)"):  # fmt: skip
        t.fit(make_graph(), dm)
    with pytest.raises(SettingError, match=r"fit\(\)'s val is .*here dm\.val_dataloader\(\)"):
        t.fit(make_graph(), dm.train_dataloader(), val=dm)
    with pytest.raises(SettingError, match=r"here dm\.predict_dataloader\(\) — dm\.setup\("
                       r"'predict'\), then predict\(g, dm\.predict_dataloader\(\)\)$"):  # fmt: skip
        t.predict(make_graph(), dm)
    with pytest.raises(SettingError, match=r"evaluate\(\)'s data is .*here dm\.val_dataloader\(\) "
                       r"— dm\.setup\('validate'\), then evaluate\(g, dm\.val_dataloader"):  # fmt: skip
        t.evaluate(make_graph(), dm)
    assert len(t.predict(make_graph(), dm.predict_dataloader())) == 4  # its loader is fine
