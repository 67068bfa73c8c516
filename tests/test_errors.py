"""The error tree: one root, each leaf also the nearest built-in, drawn in the docstring."""

from __future__ import annotations

import inspect
import re

import pytest

from somatize import errors

BUILTIN = {
    "ValueConversionError": TypeError,
    "NodeError": TypeError,
    "DeclarationError": TypeError,
    "GraphError": ValueError,
    "CycleError": ValueError,
    "DuplicateNodeError": ValueError,
    "MissingNodeError": KeyError,
    "MissingValueError": KeyError,
    "EmptyGraphError": ValueError,
    "CacheError": ValueError,
    "KeeperError": OSError,
    "TransportError": RuntimeError,
    "CheckpointError": ValueError,
    "StateError": ValueError,
    "NonFiniteError": FloatingPointError,
    "SettingError": TypeError,  # and ValueError
    "AggregationError": ValueError,
    "MissingExtraError": ImportError,
    "CrossingError": TypeError,
    "WorkerLostError": RuntimeError,
}


def classes() -> dict[str, type]:
    return {
        n: c
        for n, c in vars(errors).items()
        if inspect.isclass(c) and issubclass(c, Exception) and c.__module__ == errors.__name__
    }


def test_every_error_is_a_somatize_error_and_its_builtin() -> None:
    found = classes()
    assert set(found) == {"SomatizeError", *BUILTIN}
    for name, builtin in BUILTIN.items():
        assert issubclass(found[name], errors.SomatizeError), name
        assert issubclass(found[name], builtin), name
    for name in ("CycleError", "DuplicateNodeError", "MissingNodeError", "EmptyGraphError"):
        assert issubclass(found[name], errors.GraphError)


def test_the_docstring_draws_every_error() -> None:
    drawn = set(re.findall(r"(\w+Error)\b", errors.__doc__ or ""))
    assert set(classes()) <= drawn


def test_require_names_the_extra_to_install() -> None:
    assert errors.require("json", "none") is __import__("json")
    with pytest.raises(errors.MissingExtraError, match=r"pip install 'somatize\[dask\]'"):
        errors.require("surely_not_an_installed_module", "dask")
