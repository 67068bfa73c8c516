"""The seed pipeline: a rule-based lemmatizer feeding an embedding, a bottleneck and an LSTM.

Run it with::

    python recipes/text_pipeline.py

Four nodes, two regimes, nothing declared:

* ``Lemmatize`` has no parameters and returns *data* (lists of words). It is mapped
  item by item and cached, so each distinct sentence is lemmatized once — not once
  per step — however many epochs read it.
* ``Encode`` (an embedding), ``Bottleneck`` and ``Classify`` (an LSTM) hold modules
  and return ``Opaque`` tensors: the autograd graph runs through them untouched.

The boundary between the two falls where the gradient graph begins: at the first
node that returns ``Opaque``. The training loop is plain PyTorch over
``parameters(g)``.

The data set is synthetic: three classes of short English sentences (weather,
sport, cooking) that ``corpus()`` makes from word lists with a seeded generator —
the same sentences on every machine, nothing downloaded.
"""

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

CLASSES = ("weather", "sport", "cooking")

# Per class: nouns (made plural after "two"/"many") and verbs (inflected -s, -ed, -ing),
# all regular, so the rules of ``lemma`` map every form back to one word.
_WORDS = {
    "weather": (
        ("cloud", "storm", "wind", "shower", "breeze"),
        ("gather", "clear", "drift", "howl"),
    ),
    "sport": (("player", "goal", "team", "match", "coach"), ("kick", "pass", "cheer", "defend")),
    "cooking": (("onion", "pot", "oven", "spoon", "dish"), ("boil", "roast", "mix", "season")),
}
_DETERMINERS = ("the", "a", "two", "many")
_ENDINGS = ("today", "again", "at night", "this week", "after lunch", "by the river")
_KEEP = frozenset({"this", "is", "was", "his", "its", "us", "news", "pass"})  # not plurals


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def _inflect(verb: str, form: int) -> str:
    return verb + ("es" if verb.endswith(("s", "x", "ch", "sh")) else "s", "ed", "ing")[form]


def corpus(per_class: int = 20, seed: int = 0) -> tuple[list[str], list[int]]:
    """The synthetic 3-class text set: ``per_class`` sentences per class, and their labels.

    Deterministic for a seed. Sentences look like ``"Many storms gathered at night."``;
    the class is carried by the noun and the verb, the rest is shared.

    Example:
        >>> texts, labels = corpus(per_class=2)
        >>> len(texts), sorted(set(labels))
        (6, [0, 1, 2])
    """
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(per_class):
        for label, name in enumerate(CLASSES):
            nouns, verbs = _WORDS[name]
            det = rng.choice(_DETERMINERS)
            noun = rng.choice(nouns)
            noun = _plural(noun) if det in ("two", "many") else noun
            verb = _inflect(rng.choice(verbs), rng.randrange(3))
            texts.append(f"{det} {noun} {verb} {rng.choice(_ENDINGS)}.".capitalize())
            labels.append(label)
    return texts, labels


def lemma(word: str) -> str:
    """The lemma of one lower-case word, by suffix rules (``"dishes"`` → ``"dish"``)."""
    if word in _KEEP or len(word) <= 3:
        return word
    if word.endswith("ing") and len(word) > 5:
        return word[:-3]
    if word.endswith("ed") and len(word) > 4:
        return word[:-2]
    if word.endswith("es") and word[:-2].endswith(("s", "x", "ch", "sh")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def lemmas(text: str) -> list[str]:
    """A sentence as its lemmas: lower-cased, punctuation dropped, split on spaces."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return [lemma(w) for w in text.split()]


def vocabulary(texts: list[str]) -> list[str]:
    """The encoder's vocabulary: ``<pad>``, ``<unk>``, then every lemma, sorted."""
    return ["<pad>", "<unk>", *sorted({w for t in texts for w in lemmas(t)})]


class Lemmatize(Node):
    """Text in, lemmas out: no parameters, no gradients; returns data, so it can be cached."""

    # Counted on the class: a counter held by the instance would be node state, enter
    # the key, and change it on every call.
    calls = 0

    def forward(self, text: str, ctx):
        Lemmatize.calls += 1
        return Done(lemmas(text))


class Encode(Node):
    """Lemmas to vectors: looks the words up in ``vocab`` and embeds them."""

    def __init__(self, vocab: list[str], dim: int):
        self.index = {w: i for i, w in enumerate(vocab)}
        self.emb = nn.Embedding(len(vocab), dim, padding_idx=0)

    def forward(self, sentences: list[list[str]], ctx):
        lengths = torch.tensor([len(s) for s in sentences])
        ids = torch.zeros(len(sentences), int(lengths.max()), dtype=torch.long)  # (batch, seq)
        for row, words in enumerate(sentences):
            ids[row, : len(words)] = torch.tensor([self.index.get(w, 1) for w in words])
        return Done(Opaque((self.emb(ids.to(self.emb.weight.device)), lengths)))


class Bottleneck(Node):
    """A narrower projection of each word vector."""

    def __init__(self, dim: int, width: int):
        self.proj = nn.Sequential(nn.Linear(dim, width), nn.Tanh())

    def forward(self, x, ctx):
        h, lengths = x
        return Done(Opaque((self.proj(h), lengths)))  # (batch, seq, width)


class Classify(Node):
    """An LSTM over the (padded) sequence; its last hidden state gives the class logits."""

    def __init__(self, width: int, hidden: int, classes: int):
        self.lstm = nn.LSTM(width, hidden, batch_first=True)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x, ctx):
        h, lengths = x
        packed = pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
        _, (last, _) = self.lstm(packed)
        return Done(Opaque(self.out(last[-1])))  # (batch, classes)


def build(vocab: list[str], dim: int = 32, width: int = 16, hidden: int = 32) -> Graph:
    """The four-node graph, its lemmatizer mapped item by item and cached."""
    g = Graph.somatize(
        Lemmatize().mapped()
        >> Encode(vocab, dim)
        >> Bottleneck(dim, width)
        >> Classify(width, hidden, len(CLASSES))
    )
    return g.cache("lemmatize")


@dataclass
class Trained:
    """What ``train`` returns: the graph, the loss of every step, and lemmatizer counts."""

    graph: Graph
    losses: list[float]
    lemmatize_calls: int
    distinct_sentences: int
    sentences_seen: int


def train(
    steps: int = 60, batch_size: int = 20, lr: float = 1e-2, seed: int = 0, log_every: int = 0
) -> Trained:
    """Train the pipeline with a plain PyTorch loop over ``parameters(g)``.

    Args:
        steps: optimizer steps (each over one shuffled batch).
        batch_size: sentences per batch.
        lr: Adam's learning rate.
        seed: seeds the corpus, the initial weights and the batch order.
        log_every: print the loss every this many steps (0: silent).
    """
    torch.manual_seed(seed)
    texts, labels = corpus(seed=seed)
    g = build(vocabulary(texts))
    if log_every:
        print(g.to_text(), end="\n\n")
    model = st.module(g).train()
    opt = torch.optim.Adam(st.parameters(g), lr=lr)
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    calls_before = Lemmatize.calls
    for step in range(1, steps + 1):
        if len(order) < batch_size:  # a new epoch: reshuffle
            order += rng.sample(range(len(texts)), len(texts))
        batch, order = order[:batch_size], order[batch_size:]
        logits = model([texts[i] for i in batch])  # a list of str goes in as data
        loss = nn.functional.cross_entropy(logits, torch.tensor([labels[i] for i in batch]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log_every and (step == 1 or step % log_every == 0):
            print(
                f"step {step:3d}  loss {loss.item():.4f}  "
                f"lemmatizer calls so far {Lemmatize.calls - calls_before}"
            )
    return Trained(
        graph=g,
        losses=losses,
        lemmatize_calls=Lemmatize.calls - calls_before,
        distinct_sentences=len(set(texts)),
        sentences_seen=steps * batch_size,
    )


def main() -> None:
    result = train(log_every=10)
    print(
        f"first loss {result.losses[0]:.4f} (ln 3 = {math.log(3):.4f}), last {result.losses[-1]:.4f}"
    )
    print(
        f"lemmatizer ran {result.lemmatize_calls} times for {result.distinct_sentences} distinct "
        f"sentences, over {result.sentences_seen} sentences read"
    )


if __name__ == "__main__":
    main()
