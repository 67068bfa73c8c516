"""The recipes' data needs scikit-learn (the `recipes` extra): without it, loading the
data raises an error naming the extra to install, not a bare ModuleNotFoundError."""

from __future__ import annotations

import importlib
import sys

import pytest

from somatize.errors import MissingExtraError

LOADERS = [
    ("recipes.digits", "load_data"),
    ("recipes.federated", "load_digits"),
    ("recipes.federated_bn", "load_digits"),
    ("recipes.federated_strategies", "load"),
    ("recipes.lightning_callbacks", "load_digits"),
    ("recipes.vae_digits", "load_data"),
]


@pytest.mark.parametrize(("recipe", "loader"), LOADERS, ids=[r for r, _ in LOADERS])
def test_a_missing_scikit_learn_names_the_recipes_extra(recipe, loader, monkeypatch):
    if recipe.endswith("lightning_callbacks"):
        pytest.importorskip("lightning")
    load = getattr(importlib.import_module(recipe), loader)
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if it were not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'somatize\[recipes\]'"):
        load(0)
