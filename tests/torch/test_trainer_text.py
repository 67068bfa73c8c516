"""Raw text through the Trainer: a batch whose input is a list of strings (as a DataLoader
collates a dataset's strings) feeds a graph whose first node tokenizes it — trained,
weighed by example, cut into micro-batches and evaluated as a plain loop does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError
from somatize.torch.batches import chunk, num_examples, split
from tests.torch.lightning_quiet import QUIET

WORDS = ["rain", "sun", "wind", "goal", "team", "kick", "boil", "pot", "oven", "today", "again"]
VOCAB = {w: i + 1 for i, w in enumerate(WORDS)}
TEXTS = ["rain today", "sun again", "goal team", "kick again", "boil pot", "oven today", "wind"]
LABELS = [0, 0, 1, 1, 2, 2, 0]
DATA = list(zip(TEXTS * 3, LABELS * 3))  # 21 examples: batches of 4 leave one of 1


def ids(texts: Any) -> list[list[int]]:
    return [[VOCAB.get(w, 0) for w in t.split()] for t in texts]


class Tokenize(Node):  # data in, data out: cacheable
    def forward(self, texts: Any, ctx: Any) -> Done:
        return Done(ids(texts))


class Bag(Node):
    def __init__(self) -> None:
        self.emb = nn.EmbeddingBag(len(VOCAB) + 1, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, rows: Any, ctx: Any) -> Done:
        return Done(Opaque(bag(self.emb, self.out, rows)))


def bag(emb: nn.Module, out: nn.Module, rows: list[list[int]]) -> torch.Tensor:
    flat = torch.tensor([i for row in rows for i in row])
    offsets = torch.tensor([0] + [len(r) for r in rows[:-1]]).cumsum(0)
    return out(emb(flat, offsets))


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Tokenize() >> Bag()).cache("tokenize")


def plain(micro: int = 1, epochs: int = 2) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The same model, trained by hand: each batch's loss weighed by its examples."""
    torch.manual_seed(0)
    model = Bag()
    opt = torch.optim.SGD([*model.emb.parameters(), *model.out.parameters()], lr=0.5)
    means = []
    for _ in range(epochs):
        total = 0.0
        for texts, y in DataLoader(DATA, batch_size=4):
            opt.zero_grad()
            size = -(-len(texts) // micro)
            for i in range(0, len(texts), size):
                part, target = texts[i : i + size], y[i : i + size]
                loss = F.cross_entropy(bag(model.emb, model.out, ids(part)), target)
                (loss * len(part) / len(texts)).backward()
                total += loss.item() * len(part)
            opt.step()
        means.append(total / len(DATA))
    state = {f"bag.emb.{k}": v for k, v in model.emb.state_dict().items()}
    state |= {f"bag.out.{k}": v for k, v in model.out.state_dict().items()}
    return state, means


def trainer(micro: int = 1, **kwargs: Any) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        epochs=2,
        micro_batches=micro,
        options=st.Options(progress=False, shuffle=False),
        **kwargs,
    )


@pytest.mark.parametrize("micro", [1, 2])
def test_a_graph_fed_raw_text_trains_as_a_plain_loop_does(micro: int) -> None:
    g = graph()
    result = trainer(micro).fit(g, DataLoader(DATA, batch_size=4))
    state, means = plain(micro)
    assert result.num_examples == len(DATA)  # counted by the text's rows, not one a batch
    for k, v in state.items():
        torch.testing.assert_close(result.state[k], v)
    assert result.epoch_losses == pytest.approx(means)  # weighed by each batch's examples
    assert result.cache["tokenize"]["hits"] > 0  # epoch 2 read the tokens it stored


def test_an_evaluation_on_raw_text_averages_over_its_examples() -> None:
    g = graph()
    loader = DataLoader(DATA, batch_size=4)
    got = trainer(metrics={"acc": st.accuracy}).evaluate(g, loader)
    model = g["bag"]
    with torch.no_grad():
        logits = bag(model.emb, model.out, ids([t for t, _ in DATA]))
    target = torch.tensor([y for _, y in DATA])
    assert got["loss"] == pytest.approx(F.cross_entropy(logits, target).item(), rel=1e-6)
    assert got["acc"] == pytest.approx((logits.argmax(1) == target).float().mean().item())


def test_raw_text_is_counted_and_cut_as_its_rows() -> None:
    texts = ("a", "b", "c", "d", "e")
    assert num_examples(texts) == 5 and num_examples({"text": list(texts)}) == 5
    assert num_examples([texts, torch.arange(5)]) == 5
    parts = chunk({"text": texts, "n": torch.arange(5)}, 2)  # torch.chunk's 3 + 2
    assert [p["text"] for p in parts] == [("a", "b", "c"), ("d", "e")]
    assert [p["n"].tolist() for p in parts] == [[0, 1, 2], [3, 4]]
    with pytest.raises(
        SettingError, match=r"inputs\[0\] of 5 strings and inputs\[1\] of shape \(4,\) disagree"
    ):
        chunk((texts, torch.arange(4)), 2)


@QUIET[0]
@QUIET[1]
def test_a_lightning_graph_fed_raw_text_trains_as_the_plain_loop_does() -> None:
    import logging

    import lightning as L

    from somatize.torch.lightning import LightningGraph, result

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    lg = LightningGraph(
        graph(), loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5)
    )
    trainer = L.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(lg, DataLoader(DATA, batch_size=4), DataLoader(DATA, batch_size=7))
    got = result(trainer, lg)
    state, means = plain()
    assert got.num_examples == len(DATA)
    for k, v in state.items():
        torch.testing.assert_close(got.state[k], v)
    assert got.epoch_losses == pytest.approx(means)
    model = lg.graph["bag"]  # validation over raw text: the mean over its 21 examples
    with torch.no_grad():
        logits = bag(model.emb, model.out, ids([t for t, _ in DATA]))
    want = F.cross_entropy(logits, torch.tensor([y for _, y in DATA])).item()
    assert got.metrics[-1]["val_loss"] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("texts", [["rain today"], ["rain today", "goal team"], ("kick", "pot")])
def test_predict_on_raw_text_alone_gives_a_row_per_string(texts: Any) -> None:
    # one or two strings were read as [x] and (x, y): the first string alone, its characters
    # tokenized as rows (27 rows of output for two sentences)
    g = graph()
    model = g["bag"]
    (got,) = st.Trainer().predict(g, [texts])
    with torch.no_grad():
        want = bag(model.emb, model.out, ids(texts))
    torch.testing.assert_close(got, want)
    assert split(texts) == (texts, None)  # no target: loss(output) in training


@QUIET[0]
@QUIET[1]
@pytest.mark.parametrize("texts", [["rain today"], ["rain today", "goal team", "pot"]])
def test_a_lightning_graph_predicts_raw_text_a_row_per_string(texts: Any) -> None:
    import logging

    import lightning as L

    from somatize.torch.lightning import LightningGraph

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    g = graph()
    lg = LightningGraph(g, loss=F.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, 0.1))
    trainer = L.Trainer(logger=False, enable_progress_bar=False, accelerator="cpu")
    (got,) = trainer.predict(lg, DataLoader([texts], batch_size=None))
    model = g["bag"]
    with torch.no_grad():
        want = bag(model.emb, model.out, ids(texts))
    torch.testing.assert_close(got, want)  # (one string was tokenized as its characters)


def test_a_two_string_batch_of_text_alone_trains_on_the_whole_batch() -> None:
    seen: list[Any] = []

    class Seen(Node):
        def forward(self, texts: Any, ctx: Any) -> Done:
            seen.append(texts)
            return Done(ids(texts))

    torch.manual_seed(0)
    g = Graph.somatize(Seen() >> Bag())
    st.Trainer(
        loss=lambda out: out.logsumexp(1).mean(),
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False, shuffle=False),
    ).fit(g, [["rain today", "goal team"]])
    assert seen == [["rain today", "goal team"]]


@pytest.mark.parametrize("call", ["fit", "evaluate", "predict"])
def test_a_list_of_strings_as_data_is_refused_naming_the_fix(call: str) -> None:
    t = trainer()
    with pytest.raises(
        SettingError, match=r"list of 3 strings \('rain today', \.\.\.\).*\[texts\]"
    ):
        getattr(t, call)(graph(), ["rain today", "goal team", "boil pot"])


def test_a_list_of_text_label_pairs_is_refused_as_single_examples() -> None:
    with pytest.raises(
        SettingError, match=r"list of 21 items, each a single example \(\(str, int\)"
    ):
        trainer().fit(graph(), DATA)


LENGTH = 3  # every text's ids padded to one length: a row is keyed with its padding


class TokenizeOne(Node):  # the FAQ's: one text in, its ids out
    def forward(self, text: str, ctx: Any) -> Done:
        row = [VOCAB.get(w, 0) for w in text.split()][:LENGTH]
        return Done(row + [0] * (LENGTH - len(row)))


class Ids(Node):
    def forward(self, rows: Any, ctx: Any) -> Done:
        return Done(torch.tensor(rows))


class Encoder(Node):
    def __init__(self) -> None:
        self.emb = nn.Embedding(len(VOCAB) + 1, 8, padding_idx=0)
        self.gru = nn.GRU(8, 8, batch_first=True)

    def forward(self, ids: torch.Tensor, ctx: Any) -> Done:
        return Done(Opaque(self.gru(self.emb(ids))[1][-1]))  # (batch, 8)


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(8, 3)

    def forward(self, h: Any, ctx: Any) -> Done:
        return Done(Opaque(self.out(h)))


def test_a_mapped_tokenizer_and_a_frozen_encoder_hit_from_epoch_two_under_shuffling() -> None:
    # the FAQ's pattern: each text tokenized once, each example encoded once, a plain loop's
    # weights (g.cache("tokenize") on a tokenizer of the whole list misses every epoch)
    from somatize.watchers import EpochEnd

    torch.manual_seed(0)
    g = Graph.somatize(TokenizeOne().mapped() >> Ids() >> Encoder().with_id("enc") >> Head())
    g.cache("tokenize_one").freeze("enc").cache("enc", per="example")
    epochs: list[Any] = []
    loader = DataLoader(DATA, batch_size=4, shuffle=True)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        epochs=3,
        seed=3,
        options=st.Options(progress=False),
        watchers=[type("W", (), {"on_event": lambda s, e: epochs.append(e)})()],
    ).fit(g, loader)
    ends = [e.cache for e in epochs if isinstance(e, EpochEnd)]
    assert [c["tokenize_one"]["misses"] for c in ends][1:] == [0, 0]
    assert [c["enc"]["misses"] for c in ends][1:] == [0, 0]

    torch.manual_seed(0)
    tok, enc, head = TokenizeOne(), Encoder(), Head()
    sgd = torch.optim.SGD(head.out.parameters(), lr=0.5)
    for e in range(3):  # the Trainer's order (trainer.md's plain loop)
        loader.sampler.generator = torch.Generator().manual_seed(3 * 1_000_003 + e)
        loader.generator = torch.Generator().manual_seed(3 * 1_000_003 + e + 500_009)
        for texts, y in loader:
            with torch.no_grad():
                h = enc.forward(torch.tensor([tok.forward(t, None).value for t in texts]), None)
            loss = F.cross_entropy(head.out(h.value.value), y)
            sgd.zero_grad()
            loss.backward()
            sgd.step()
    torch.testing.assert_close(result.state["head.out.weight"], head.out.weight.detach())
