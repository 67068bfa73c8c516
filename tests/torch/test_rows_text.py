"""A frozen transformer text encoder remembered per example, as NLP users write it: token
ids and an attention mask in a dict batch, ``Pick`` before the encoder, labels apart
(``Trainer(split=...)``), ``nn.TransformerEncoder`` on its eval-mode fast path. The head
trained over the cache equals a plain PyTorch loop over the uncached encoder (float
tolerance: misses run in batches of other sizes), whatever the padding."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque, Pick

N, SEQ, DIM, VOCAB = 48, 12, 16, 20


def corpus() -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, SEQ + 1, (N,), generator=g)
    ids = [torch.randint(2, VOCAB, (int(n),), generator=g) for n in lengths]
    return ids, torch.randint(0, 3, (N,), generator=g)


class Texts(Dataset):
    def __init__(self):
        self.ids, self.labels = corpus()

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.ids[i], self.labels[i]


def collate(fixed: bool):
    def batch(items):
        length = SEQ if fixed else max(len(ids) for ids, _ in items)  # or the batch's longest
        ids = torch.zeros(len(items), length, dtype=torch.long)
        mask = torch.zeros(len(items), length, dtype=torch.long)
        for row, (seq, _) in enumerate(items):
            ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
        labels = torch.stack([y for _, y in items])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return batch


def loader(fixed: bool) -> DataLoader:
    order = torch.Generator().manual_seed(1)
    return DataLoader(Texts(), 8, shuffle=True, generator=order, collate_fn=collate(fixed))


class Encoder(Node):
    """Embedding + 2 transformer layers; per-token states, or the first ([CLS]) token's."""

    def __init__(self, tokens: bool, nested: bool = False):
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=0)
        layer = nn.TransformerEncoderLayer(DIM, 2, 32, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested)
        self.tokens = tokens

    def forward(self, batch, ctx):
        pad = batch["attention_mask"] == 0
        h = self.enc(self.emb(batch["input_ids"]), src_key_padding_mask=pad)  # (batch, seq, dim)
        return Done(Opaque(h if self.tokens else h[:, 0]))


class Head(Node):
    def __init__(self, tokens: bool):
        self.out = nn.Linear(DIM, 3)
        self.tokens = tokens

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h[:, 0] if self.tokens else h)))


def split(batch):
    return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]


def plain(tokens: bool, fixed: bool, nested: bool, epochs: int) -> dict[str, torch.Tensor]:
    """The same training in plain PyTorch: encoder frozen (eval, no grad), head trained."""
    torch.manual_seed(0)
    enc, head = Encoder(tokens, nested), Head(tokens)
    for m in (enc.emb, enc.enc):
        m.eval().requires_grad_(False)
    opt = torch.optim.Adam(head.out.parameters(), lr=1e-2)
    batches = loader(fixed)
    for epoch in range(epochs):  # (the Trainer's order: docs/trainer.md, seed 0)
        batches.sampler.generator = torch.Generator().manual_seed(epoch)  # type: ignore[attr-defined]
        for batch in batches:
            x, y = split(batch)
            h = enc.forward(x, None).value.value
            loss = nn.functional.cross_entropy(head.forward(h, None).value.value, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {k: v.detach().clone() for k, v in head.out.state_dict().items()}


# (nested: the encoder's fast path runs the batch as a nested tensor, zeros at the pads)
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
@pytest.mark.parametrize(
    ("tokens", "fixed", "nested"),
    [
        (True, True, False),
        (False, True, False),
        (True, False, False),
        (False, False, False),
        (True, False, True),
    ],
    ids=["tokens-fixed", "cls-fixed", "tokens-longest", "cls-longest", "tokens-longest-nested"],
)
def test_a_head_over_a_cached_text_encoder_trains_as_plain_pytorch(tokens, fixed, nested):
    torch.manual_seed(0)
    keeper = MemoryKeeper()
    g = Graph.somatize(
        Pick("input_ids", "attention_mask")
        >> Encoder(tokens, nested).with_id("enc")
        >> Head(tokens),
        keeper=keeper,
    )
    g.freeze("enc").cache("enc", per="example")
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        epochs=3,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        split=split,
    )
    if fixed:
        result = trainer.fit(g, loader(fixed))
    else:  # (rows of several lengths, some missed: the fit names the padding)
        with pytest.warns(RuntimeWarning, match="padded to its own longest"):
            result = trainer.fit(g, loader(fixed))
    counts = result.cache["enc"]
    assert counts["hits"] + counts["misses"] == 3 * N
    if fixed:  # every example at one length: epochs 2-3 all hit
        assert counts == {"hits": 2 * N, "misses": N}
    else:  # a row is its bytes, padding included: it hits at a length it met before
        assert 0 < counts["hits"] < 2 * N
    want = plain(tokens, fixed, nested, epochs=3)
    got = {k.rpartition("out.")[2]: v for k, v in result.state.items() if "out." in k}
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=1e-4)
    # a row costs its output's bytes and a layout prefix of about 60 bytes, dtype kept
    row = (SEQ if tokens else 1) * DIM * 4
    stats = keeper.stats()
    if fixed:
        assert row < stats.bytes / stats.entries < row + 100
