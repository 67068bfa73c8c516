"""A node cached per example whose input is padded to each batch's longest sequence: the
fit says so (node, hit rate, the row shapes seen, the fix) once the epochs after the first
find only some of its rows; fixed or bucketed lengths that hit, and a fixed-shape input,
are not warned about."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque, Recorder
from somatize.torch.tally import CacheTally
from somatize.watchers import CacheRows, EpochEnd

N, B, LONGEST, VOCAB, DIM = 96, 8, 8, 128, 8  # 12 batches an epoch
PER_EPOCH = N // B


def corpus() -> tuple[list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, LONGEST + 1, (N,), generator=gen)
    ids = [torch.randint(1, VOCAB, (int(n),), generator=gen) for n in lengths]
    for i, seq in enumerate(ids):  # each example's first token its own: no two alike
        seq[0] = i + 1
    return ids, torch.randint(0, 3, (N,), generator=gen)


class Texts(Dataset):
    def __init__(self) -> None:
        self.ids, self.labels = corpus()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        return self.ids[i], self.labels[i]


class Padded:
    """A collate_fn padding each batch to ``length`` (None: to the batch's longest, as
    ``pad_sequence`` does), noting each batch's padded length."""

    def __init__(self, length=None) -> None:
        self.length = length
        self.lengths: list[int] = []

    def __call__(self, items):
        ids = pad_sequence([seq for seq, _ in items], batch_first=True)  # (batch, longest)
        if self.length is not None:
            ids = F.pad(ids, (0, self.length(items) - ids.shape[1]))
        self.lengths.append(ids.shape[1])
        return ids, torch.stack([y for _, y in items])


class Encoder(Node):
    """A frozen bag of embeddings: the mean over the tokens the mask keeps."""

    def __init__(self) -> None:
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=0)

    def forward(self, ids, ctx):
        mask = (ids != 0).unsqueeze(-1).float()  # (batch, seq, 1)
        return Done(Opaque((self.emb(ids) * mask).sum(1) / mask.sum(1)))


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(DIM, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


def graph(keeper=None):
    torch.manual_seed(0)
    g = Graph.somatize(Encoder().with_id("enc") >> Head(), keeper=keeper)
    return g.freeze("enc").cache("enc", per="example")


def trainer(epochs=3, watchers=(), checkpoint=None) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        watchers=list(watchers),
        checkpoint=checkpoint,
        options=st.Options(progress=False),
    )


def shuffled(collate) -> DataLoader:
    return DataLoader(Texts(), batch_size=B, shuffle=True, collate_fn=collate)


HINT = re.compile(
    r"node 'enc' is cached per example, but epoch (\d+) found only (\d+)% of its ([\d,]+) "
    r"rows \(([\d,]+)\) stored by an earlier epoch, and its input came in rows of (\d+) "
    r"shapes, \((\d+),\) to \((\d+),\): likely each batch padded to its own longest"
)


def hints(caught) -> list[re.Match[str]]:
    found = [HINT.search(str(w.message)) for w in caught]
    return [m for m in found if m is not None]


def test_rows_padded_to_each_batchs_longest_are_named_once_with_rate_and_shapes():
    collate, rec = Padded(), Recorder()
    with pytest.warns(RuntimeWarning) as caught:
        result = trainer(watchers=[rec]).fit(graph(), shuffled(collate))
    (hint,) = hints(caught)  # epochs 2 and 3 both miss some rows: said once
    assert len(caught) == 1 and caught[0].filename == __file__  # at the fit call
    epoch, share, rows, hits, count, low, high = map(
        int, (g.replace(",", "") for g in hint.groups())
    )
    assert epoch == 2
    counts = [e.cache["enc"] for e in rec.of(EpochEnd)]
    assert counts[1] == {"hits": hits, "misses": rows - hits} and rows == N
    assert 10 <= share < 90 and share == hits * 100 // rows
    # the shapes are those the collate_fn padded epoch 2's batches to
    assert len(collate.lengths) == 3 * PER_EPOCH
    second = collate.lengths[PER_EPOCH : 2 * PER_EPOCH]
    assert (count, low, high) == (len(set(second)), min(second), max(second)) and count > 1
    assert result.cache["enc"] == {
        "hits": sum(c["hits"] for c in counts),
        "misses": sum(c["misses"] for c in counts),
    }
    message = str(caught[0].message)
    assert "pad_sequence" in message and "DataCollatorWithPadding" in message
    assert 'padding="max_length"' in message and "bucket lengths" in message


def test_a_fixed_length_hits_every_row_and_is_not_warned_about():
    collate = Padded(length=lambda items: LONGEST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = trainer().fit(graph(), shuffled(collate))
    assert set(collate.lengths) == {LONGEST}
    assert result.cache == {"enc": {"hits": 2 * N, "misses": N}}


class Buckets(Sampler[list[int]]):
    """Batches of examples of one bucket (lengths up to 4, or longer), shuffled each epoch."""

    def __init__(self, texts: Texts) -> None:
        short = [i for i, seq in enumerate(texts.ids) if len(seq) <= 4]
        self.buckets = [short, [i for i in range(N) if i not in set(short)]]

    def __iter__(self):
        batches = []
        for bucket in self.buckets:
            order = [bucket[int(j)] for j in torch.randperm(len(bucket))]
            batches += [order[k : k + B] for k in range(0, len(order), B)]
        return iter([batches[int(j)] for j in torch.randperm(len(batches))])

    def __len__(self) -> int:
        return sum(-(-len(b) // B) for b in self.buckets)


def test_bucket_lengths_each_example_always_meets_hit_and_are_not_warned_about():
    texts = Texts()
    collate = Padded(length=lambda items: 4 if max(len(s) for s, _ in items) <= 4 else LONGEST)
    data = DataLoader(texts, batch_sampler=Buckets(texts), collate_fn=collate)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = trainer().fit(graph(), data)
    assert set(collate.lengths) == {4, LONGEST}  # rows of two shapes in every epoch
    assert result.cache == {"enc": {"hits": 2 * N, "misses": N}}


class HalfNoisy(Dataset):
    """Every odd example with a fresh random first token at every read: half the rows miss,
    all at one length."""

    def __init__(self) -> None:
        self.texts = Texts()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        seq, y = self.texts[i]
        seq = F.pad(seq, (0, LONGEST - len(seq)))
        if i % 2:
            seq = seq.clone()
            seq[0] = int(torch.randint(1, VOCAB, ()))
        return seq, y


def test_a_middling_hit_rate_at_one_row_shape_is_not_called_padding():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = trainer().fit(graph(), DataLoader(HalfNoisy(), batch_size=B, shuffle=True))
    hits = result.cache["enc"]["hits"]
    assert 0.1 * 2 * N <= hits < 0.9 * 2 * N  # (neither cold nor warm: no cause to name)


# -- resumed: said once a run, through the checkpoint's tally ---------------------------


def crash_and_resume(tmp_path, edit=None):
    """Four epochs; crash in epoch 3, resume from the checkpoint of epoch 2's end (after the
    hint), with the same keeper. ``edit`` may rewrite that checkpoint's payload first."""
    from somatize.torch import integrity
    from tests.torch.test_checkpoint_resume import Crash, CrashAt

    keeper, ckpt = MemoryKeeper(), st.Checkpointing(tmp_path / "ckpt", keep=10)
    with pytest.raises(Crash), pytest.warns(RuntimeWarning, match="padded to its own longest"):
        fit = trainer(epochs=4, watchers=[CrashAt(2 * PER_EPOCH + 2)], checkpoint=ckpt)
        fit.fit(graph(keeper), shuffled(Padded()))
    path = tmp_path / "ckpt" / f"step-{2 * PER_EPOCH:09d}.ckpt"
    payload = st.load_checkpoint(path)
    assert payload["cache"][0]["warned"] == ["enc"]
    if edit is not None:
        edit(payload)
        integrity.write_checkpoint(path, payload)
    rec = Recorder()
    fit = trainer(epochs=4, watchers=[rec], checkpoint=ckpt)
    return fit.fit(graph(keeper), shuffled(Padded()), resume=path), rec


def test_a_resumed_fit_does_not_repeat_the_hint(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result, rec = crash_and_resume(tmp_path)
    assert result.steps == 4 * PER_EPOCH
    last = rec.of(EpochEnd)[-1].cache["enc"]  # epoch 4, compared with epoch 3: some miss
    assert 0 < last["hits"] < 0.9 * N


def test_without_the_remembered_node_the_resumed_fit_would_say_it_again(tmp_path):
    def forget(payload):
        payload["cache"][0]["warned"] = []

    with pytest.warns(RuntimeWarning) as caught:
        crash_and_resume(tmp_path, edit=forget)
    assert [int(m.group(1)) for m in hints(caught)] == [4]  # (epoch 3: a new process's first)


# -- the tally alone ----------------------------------------------------------------------


def layout(length: int, dtype: str = "int64") -> tuple:
    """A dict batch's row layout, as ``CacheRows.layout`` gives it."""
    leaf = ("torch.tensor", (dtype, (length,)))
    return ("dict", ("attention_mask", "input_ids"), (leaf, leaf))


def epochs(tally: CacheTally, first: int, second: list[tuple[int, int, tuple]]):
    """An epoch storing ``first`` rows, then one of (hits, misses, layout) batches."""
    tally.on_event(CacheRows("r", "enc", 0, 0, first, (), layout(17)))
    tally.end_epoch(0)
    for hits, misses, lay in second:
        tally.on_event(CacheRows("r", "enc", 1, hits, misses, (), lay))
    tally.end_epoch(1)


def test_the_hint_names_the_fields_whose_shapes_vary_and_rounds_the_rate_down():
    tally = CacheTally()
    nine = [(4, 6, layout(n)) for n in (17, 20, 23, 30, 41, 50, 52, 60)] + [(14, 6, layout(64))]
    with pytest.warns(RuntimeWarning) as caught:
        epochs(tally, 100, nine)
    assert "found only 46% of its 100 rows (46) stored by an earlier epoch" in str(
        caught[0].message
    )
    said = "rows of 9 shapes, 'attention_mask' (17,) to (64,), 'input_ids' (17,) to (64,): "
    assert said in str(caught[0].message)
    with pytest.warns(RuntimeWarning, match=r"found only 89% of its 1,000 rows \(896\)"):
        epochs(CacheTally(), 1000, [(448, 52, layout(17)), (448, 52, layout(30))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        epochs(CacheTally(), 1000, [(450, 50, layout(17)), (450, 50, layout(30))])  # 90%
        # a tally restored from the state of one that warned does not warn again
        epochs(CacheTally(tally.state()), 100, nine)


def test_no_hint_without_shapes_beyond_the_batch_dim_to_name():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # rows of one shape in two dtypes; events made without a layout
        epochs(CacheTally(), 100, [(25, 25, layout(17)), (25, 25, layout(17, "int32"))])
        epochs(CacheTally(), 100, [(25, 25, ()), (25, 25, ())])


def test_a_cold_epoch_says_the_shapes_first():
    with pytest.warns(RuntimeWarning) as caught:
        epochs(CacheTally(), 100, [(2, 48, layout(17)), (2, 48, layout(30))])
    message = str(caught[0].message)
    assert "only 4 of its 100 lookups of epoch 2" in message
    shapes = "Its input came in rows of 2 shapes this epoch, 'attention_mask' (17,) to (30,)"
    assert shapes in message and "Other possible causes: " in message
    assert message.count("DataCollatorWithPadding") == 1  # (not in the list of causes again)
