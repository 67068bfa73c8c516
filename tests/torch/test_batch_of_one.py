"""BatchNorm's refusal of a training batch of one row gets a note naming the batch (epoch,
index, its one row) and the fix, on every path of the Trainer's loop. Found by an outside
audit: a federated client with 21 examples in batches of 10 failed with torch's bare
"Expected more than 1 value per channel when training"."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder

FIX = "drop_last=True"


class Normed(Node):
    def __init__(self, rows=None):
        self.lin, self.bn, self.out = nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)
        self.rows = rows

    def forward(self, x, ctx):
        h = self.lin(x)
        if self.rows is not None:  # a model that normalises a slice of its own
            h = h[: self.rows]
        return Done(Opaque(self.out(torch.relu(self.bn(h)))))


GEN = torch.Generator().manual_seed(0)
X, Y = torch.randn(21, 4, generator=GEN), torch.randint(0, 3, (21,), generator=GEN)


def notes_of(train, *, rows=None, watchers=(), micro_batches=1, **options):
    torch.manual_seed(0)
    trainer = st.Trainer(
        loss=(lambda out, y: F.cross_entropy(out, y[: len(out)])),
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        micro_batches=micro_batches,
        watchers=list(watchers),
        options=st.Options(**{"progress": False, **options}),
    )
    with pytest.raises(ValueError, match="Expected more than 1 value per channel") as e:
        trainer.fit(Graph.somatize(Normed(rows)), train)
    return "\n".join(getattr(e.value, "__notes__", []))


@pytest.mark.parametrize("watchers", [(), (Recorder(),)], ids=["fast-path", "step-path"])
def test_a_last_batch_of_one_row_is_named_with_the_fix(watchers):
    batches = list(zip(X.split(10), Y.split(10)))  # 10, 10 and 1 rows
    notes = notes_of(batches, watchers=watchers, shuffle=False)
    assert "raised by node 'normed'" in notes  # (the core's note stays)
    assert "batch 2 of epoch 0 (step 3, train[2] in the order given) has 1 row" in notes
    assert FIX in notes and "leave such a client out" in notes
    shuffled = notes_of(batches, watchers=watchers)  # read in another order: both said
    order = torch.randperm(3, generator=torch.Generator().manual_seed(0)).tolist()
    assert f"batch {order.index(2)} of epoch 0 (step {order.index(2) + 1}, train[2] " in shuffled


def test_a_dataloaders_last_batch_of_one_row_is_named_too():
    loader = DataLoader(TensorDataset(X, Y), batch_size=10)
    notes = notes_of(loader)
    assert "batch 2 of epoch 0 (step 3) has 1 row" in notes and FIX in notes
    fine = DataLoader(TensorDataset(X, Y), batch_size=10, drop_last=True)  # the fix works
    torch.manual_seed(0)
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Normed()), fine)


def test_a_micro_batch_of_one_row_and_an_accumulated_group_say_which_they_were():
    notes = notes_of([(X[:3], Y[:3])], micro_batches=2)  # chunks of 2 and 1 rows
    assert "micro-batch of batch 0 of epoch 0 (step 1) has 1 row" in notes
    assert "Trainer(micro_batches=2)" in notes and FIX not in notes
    grouped = notes_of(list(zip(X.split(10), Y.split(10))), accumulate=3, shuffle=False)
    assert "one of batches 0-2 of epoch 0 (step 1) has 1 row" in grouped


def test_no_note_where_the_batch_has_more_rows_than_the_model_normalised():
    notes = notes_of([(X[:8], Y[:8])], rows=1)  # the model sliced one row out itself
    assert "has 1 row" not in notes
