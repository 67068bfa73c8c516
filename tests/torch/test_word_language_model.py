"""The word-language-model recipe: TBPTT with a carried state, clipping, plateau annealing,
the best checkpoint reloaded for the test."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
import word_language_model as wlm


def test_windows_carry_each_stream_on_and_targets_are_the_next_token():
    words = wlm.corpus(200, seed=0)
    ws = wlm.windows(words, batch=4, bptt=5)
    x0, y0 = ws[0]
    assert x0.shape == (4, 5) and torch.equal(x0[:, 1:], y0[:, :-1])
    x1, _ = ws[1]
    assert torch.equal(x1[:, 0], y0[:, -1])  # window 2 of a stream follows window 1


@pytest.mark.slow
def test_the_recipe_learns_the_grammar_and_reloads_the_best(tmp_path, capsys):
    got = wlm.main(["--epochs", "2", "--tokens", "4000", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "best val loss" in out and "test ppl" in out
    assert math.exp(got["test_loss"]) < got["vocab"] / 2  # far better than knowing nothing
    assert (tmp_path / "ckpt" / "best").is_file()
    assert (tmp_path / "log.csv").read_text().count("\neval,") == 2


def test_the_recipes_perplexity_is_over_tokens_as_the_originals(tmp_path):
    # the original's exp(sum of every token's loss / tokens); the last window is shorter, so
    # exp(test_loss), averaged over rows, weighs its few tokens as much as a full window's
    torch.set_num_threads(1)
    args = ["--epochs", "1", "--tokens", "1500", "--bptt", "7", "--batch", "4"]
    got = wlm.main([*args, "--out", str(tmp_path)])
    best = st.Checkpointing(tmp_path / "ckpt").best_file()
    torch.manual_seed(0)
    lm = wlm.LanguageModel(len(wlm.VOCAB), 32, 64, layers=2, dropout=0.2)
    model = st.load_checkpoint(best)["model"]
    for name in ("embed", "rnn", "decode"):
        getattr(lm, name).load_state_dict(
            {k.split(".", 2)[2]: v for k, v in model.items() if k.split(".")[1] == name}
        )
        getattr(lm, name).eval()
    test = wlm.windows(wlm.corpus(1500 // 5, seed=3), 4, 7)
    assert test[-1][0].shape[1] < 7  # a short last window
    total, tokens, hidden = 0.0, 0, None
    with torch.no_grad():
        for x, y in test:
            out, hidden = lm.rnn(lm.embed(x), hidden)
            logits = lm.decode(out)
            total += F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"
            ).item()
            tokens += y.numel()
    assert got["test_ppl"] == pytest.approx(math.exp(total / tokens), rel=1e-5)
    assert math.exp(got["test_loss"]) != pytest.approx(math.exp(total / tokens), rel=1e-5)
