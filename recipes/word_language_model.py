"""pytorch/examples' word-language-model, ported: an LSTM language model trained with
truncated backprop through time, gradient clipping, the learning rate annealed on a
plateau, and the best model reloaded for the test.

Run it with::

    python recipes/word_language_model.py [--epochs 6] [--out runs/wlm]

What maps to what (the original in brackets):

* the hidden state carried from one BPTT window to the next [``repackage_hidden``]
  is an ``st.Carry`` in the node: stored detached, reset by the Trainer at each epoch
  and each evaluation — and not part of the model's state dict;
* ``--clip`` [``clip_grad_norm_``] is ``Options(clip_grad_norm=...)``;
* "divide the learning rate by 4 when validation does not improve" is
  ``ReduceLROnPlateau(factor=0.25, patience=0)``, stepped by the Trainer with
  ``val_loss`` after each evaluation;
* "save the model when validation improves, reload it for the test" is
  ``Checkpointing(..., best=1)`` and ``st.load_state(g, st.load_checkpoint(
  result.best_checkpoint))``.
* perplexity [``math.exp`` of the loss averaged over every token] is
  ``torchmetrics.text.Perplexity()`` as a metric (``val_ppl``): ``val_loss`` is averaged
  over *examples* (rows, here streams), so the last, shorter window would weigh as much as
  a full one in ``math.exp(val_loss)``.

The corpus is generated: sentences from a small seeded grammar (``corpus()``), the same
on every machine, nothing downloaded. A word the grammar makes predictable (an article
after a preposition, the full stop...) is learnt quickly; the test perplexity ends far
below the vocabulary's size (a model that knows nothing scores that).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics.text import Perplexity

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

WORDS = {
    "det": ["the", "a", "every", "my"],
    "adj": ["small", "red", "old", "quiet", "happy"],
    "noun": ["cat", "dog", "bird", "child", "teacher", "house", "garden", "river"],
    "verb": ["sees", "likes", "follows", "finds", "watches"],
    "intrans": ["sleeps", "sings", "runs", "waits"],
    "prep": ["near", "behind", "under", "beside"],
}


def sentence(rng: random.Random) -> list[str]:
    """One sentence of the grammar: NP (VERB NP | INTRANS [PREP NP]) ."""

    def np() -> list[str]:
        words = [rng.choice(WORDS["det"])]
        if rng.random() < 0.4:
            words.append(rng.choice(WORDS["adj"]))
        return [*words, rng.choice(WORDS["noun"])]

    words = np()
    if rng.random() < 0.5:
        words += [rng.choice(WORDS["verb"]), *np()]
    else:
        words.append(rng.choice(WORDS["intrans"]))
        if rng.random() < 0.6:
            words += [rng.choice(WORDS["prep"]), *np()]
    return [*words, "."]


def corpus(tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < tokens:
        out += sentence(rng)
    return out[:tokens]


VOCAB = sorted({w for ws in WORDS.values() for w in ws} | {"."})
INDEX = {w: i for i, w in enumerate(VOCAB)}


def windows(words: list[str], batch: int, bptt: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The original's ``batchify`` + ``get_batch``: ``batch`` parallel streams cut in
    windows of ``bptt`` tokens, each target the next token. In order: the state carries."""
    ids = torch.tensor([INDEX[w] for w in words])
    n = (len(ids) - 1) // batch
    xs = ids[: n * batch].view(batch, n)  # (batch, n): stream b is a contiguous slice
    ys = ids[1 : n * batch + 1].view(batch, n)
    return [(xs[:, i : i + bptt], ys[:, i : i + bptt]) for i in range(0, n, bptt)]


class LanguageModel(Node):
    """Embedding, LSTM, dropout, decoder; the hidden state carried across windows."""

    def __init__(self, vocab: int, dim: int, hidden: int, layers: int, dropout: float) -> None:
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(
            dim, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0
        )
        self.drop = nn.Dropout(dropout)
        self.decode = nn.Linear(hidden, vocab)
        self.hidden = st.Carry()  # (h, c), detached on set: truncated backprop

    def forward(self, x, ctx):  # x: (batch, bptt) token ids
        out, state = self.rnn(self.drop(self.embed(x)), self.hidden.value)
        self.hidden.set(state)
        return Done(Opaque(self.decode(self.drop(out))))  # (batch, bptt, vocab)


def next_word_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=5.0)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--bptt", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=12_000)
    p.add_argument("--out", default="runs/wlm")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(min(4, torch.get_num_threads()))

    train = windows(corpus(args.tokens, seed=1), args.batch, args.bptt)
    val = windows(corpus(args.tokens // 5, seed=2), args.batch, args.bptt)
    test = windows(corpus(args.tokens // 5, seed=3), args.batch, args.bptt)

    torch.manual_seed(args.seed)
    g = Graph.somatize(LanguageModel(len(VOCAB), 32, 64, layers=2, dropout=0.2))
    out = Path(args.out)
    trainer = st.Trainer(
        loss=next_word_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=args.lr),
        scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, factor=0.25, patience=0
        ),
        epochs=args.epochs,
        metrics={"ppl": Perplexity()},  # over tokens: the original's exp(total loss / tokens)
        checkpoint=st.Checkpointing(out / "ckpt", keep=1, best=1),
        watchers=[st.CSVLog(out / "log.csv")],
        seed=args.seed,
        options=st.Options(clip_grad_norm=args.clip, shuffle=False, progress=False),  # in order
    )
    result = trainer.fit(g, train, val=val, resume="last")
    for record in result.metrics:
        print(f"epoch {record['epoch'] + 1}: val loss {record['val_loss']:.3f}, "
              f"val ppl {record['val_ppl']:.2f}")  # fmt: skip

    st.load_state(g, st.load_checkpoint(result.best_checkpoint))  # the best model
    tested = trainer.evaluate(g, test)
    print(f"best val loss {result.best:.3f} at {Path(result.best_checkpoint).name}")
    print(f"test loss {tested['loss']:.3f}, test ppl {tested['ppl']:.2f} (vocabulary {len(VOCAB)})")
    return {
        "best": float(result.best),
        "test_loss": tested["loss"],
        "test_ppl": tested["ppl"],
        "vocab": float(len(VOCAB)),
    }


if __name__ == "__main__":
    main()
