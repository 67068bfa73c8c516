"""The seed pipeline (``recipes/text_pipeline.py``) trains as the issue states."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

import somatize.torch as st

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "text_pipeline.py"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("text_pipeline", RECIPE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # so the node classes' source can be read for their keys
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def trained(recipe):
    return recipe.train(steps=60)


def test_corpus_is_synthetic_deterministic_and_balanced(recipe):
    texts, labels = recipe.corpus()
    assert (texts, labels) == recipe.corpus()
    assert recipe.corpus(seed=1) != (texts, labels)
    assert [labels.count(c) for c in range(3)] == [20, 20, 20]
    assert recipe.vocabulary(texts) == recipe.vocabulary(list(reversed(texts)))


def test_lemmatizer_rules(recipe):
    assert recipe.lemmas("Many Dishes boiled, the coaches passing!") == [
        "many",
        "dish",
        "boil",
        "the",
        "coach",
        "pass",
    ]
    assert recipe.lemmas("This pass") == ["this", "pass"]


def test_loss_starts_near_ln3_and_falls_below_005_within_60_steps(trained):
    assert len(trained.losses) == 60
    assert abs(trained.losses[0] - math.log(3)) < 0.1
    assert min(trained.losses) < 0.05
    assert trained.losses[-1] < 0.05


def test_lemmatizer_runs_once_per_distinct_sentence(trained):
    assert trained.distinct_sentences == 60
    assert trained.sentences_seen == 1200  # 60 steps x 20 sentences: 20 reads of each
    assert trained.lemmatize_calls == trained.distinct_sentences


def test_regimes_meet_where_the_gradient_graph_begins(recipe, trained):
    g = trained.graph
    assert g.memory.cached == {"lemmatize"} and not g.memory.frozen  # nothing else declared
    assert not any(k.startswith("lemmatize") for k in st.module(g).state_dict())
    # the data side: one keeper entry per distinct sentence (lists of words), nothing else
    assert len(g.keeper) == trained.distinct_sentences
    texts, _ = recipe.corpus()
    assert g.forward(texts[:1]) is not None and len(g.keeper) == trained.distinct_sentences
    # the Opaque side: logits with their autograd graph, reaching the first node with weights
    outcome = g.run(texts[:3])
    assert outcome.opaque and outcome.value.requires_grad
    g["encode"].emb.weight.grad = None
    outcome.value.sum().backward()
    assert g["encode"].emb.weight.grad is not None


def test_trained_pipeline_classifies_the_corpus(recipe, trained):
    texts, labels = recipe.corpus()
    model = st.module(trained.graph).eval()
    with torch.no_grad():
        predicted = model(texts).argmax(dim=1)
    assert predicted.tolist() == labels
