"""The word-language-model recipe: TBPTT with a carried state, clipping, plateau annealing,
the best checkpoint reloaded for the test."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

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
