"""Globals a node's code reads that are neither functions, classes nor data: a
``functools.partial``, an instance of the user's own class, a library object. The first
two enter the key by content; the last makes a warning naming the class and the global."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from somatize.memory import NodeKeys

Writer = Callable[[str, str], ModuleType]


def node_key(impl: Any) -> str:
    return NodeKeys(()).of(impl, ["in"])


PARTIAL = """
import functools
from somatize import Node, Done
def mul(x, k): return x * k
f = functools.partial(mul, k={k})
class Enc(Node):
    def forward(self, x, ctx):
        return Done(f(x))
"""

INSTANCE = """
from somatize import Node, Done
class Tok:
    def __init__(self, k):
        self.k = k
        self.me = self  # an object holding itself: no endless walk
        self.table = {{"a": [k]}}
    def go(self, x): return x * {factor}
TOK = Tok({k})
class Enc(Node):
    def forward(self, x, ctx):
        return Done(TOK.go(x) + TOK.k)
"""


def test_a_global_partial_enters_the_key_by_its_function_and_arguments(
    user_module: Writer,
) -> None:
    mod = user_module("glob_partial", PARTIAL.format(k=2))
    before = node_key(mod.Enc())
    assert node_key(mod.Enc()) == before  # stable
    mod = user_module("glob_partial", PARTIAL.format(k=5))
    assert node_key(mod.Enc()) != before


def test_a_global_instance_enters_the_key_by_its_class_code_and_its_data(
    user_module: Writer,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all of it is seen: no warning
        mod = user_module("glob_inst", INSTANCE.format(k=2, factor=2))
        base = node_key(mod.Enc())
        assert node_key(mod.Enc()) == base
        mod = user_module("glob_inst", INSTANCE.format(k=5, factor=2))
        data_changed = node_key(mod.Enc())
        mod = user_module("glob_inst", INSTANCE.format(k=2, factor=3))
        code_changed = node_key(mod.Enc())
    assert len({base, data_changed, code_changed}) == 3
    mod.TOK.table["a"].append(1)  # a fresh key sees a change made in place
    assert node_key(mod.Enc()) != code_changed


def test_a_global_the_key_cannot_see_is_warned_about_once_naming_class_and_global(
    user_module: Writer,
) -> None:
    mod = user_module(
        "glob_blind",
        """
        import logging, threading
        from somatize import Node, Done
        log = logging.getLogger("glob_blind")  # a logger is no part of an output: no warning
        class Holder:
            def __init__(self): self.lock = threading.Lock()
        HOLD = Holder()
        class Enc(Node):
            def forward(self, x, ctx):
                log.debug("enc")
                with HOLD.lock:
                    return Done(x)
        """,
    )
    with pytest.warns(UserWarning) as caught:
        node_key(mod.Enc())
    assert [str(w.message).split(",")[0] for w in caught] == [
        "node class 'glob_blind.Enc' reads the global HOLD.lock (a lock)"
    ]  # the lock, not the logger
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        node_key(mod.Enc())  # once per process


def test_a_library_function_that_is_not_python_code_enters_by_name_without_a_warning(
    user_module: Writer,
) -> None:
    # np.dot (a dispatcher), np.exp (a ufunc), np.random.default_rng (Cython) and
    # str.lower (a method descriptor) each warned "enters its key by type alone", for
    # every node using numpy; they are library code, known by their names
    pytest.importorskip("numpy")
    source = """
        import numpy as np
        from somatize import Node, Done
        class Enc(Node):
            def __init__(self):
                self.w = np.random.default_rng(0).standard_normal(3)
            def forward(self, x, ctx):
                return Done(str.lower(x[0]) + str(np.exp(np.dot(self.w, x[1]))))
        """
    mod = user_module("glob_numpy", source)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        key = node_key(mod.Enc())
    assert key == node_key(mod.Enc())
    import numpy as np

    from somatize.identity import _describe

    assert [_describe(f, {}) for f in (np.exp, np.log, str.lower)] == [
        "lib:numpy.exp",
        "lib:numpy.log",
        "lib:builtins.str.lower",
    ]
