"""Code changed in place is seen (``somatize/own_code.py``, ``bindings.still``): a method
patched on a node class, a function's ``__code__`` replaced as IPython's ``%autoreload 2``
does, a source file edited while the process runs the code it imported, a node's
``forward`` replaced on the instance or its ``__class__`` changed. In each case the
running graph and a new graph sharing its keeper compute what the node computes now."""

from __future__ import annotations
import __future__

import importlib
import os
import sys
import types

from somatize import Done, Graph, MemoryKeeper, Node
from somatize.changes import key_parts
from somatize.identity import identity
from somatize.own_code import _own
from somatize.watchers import CacheHit, Recorder


class Scale(Node):
    def forward(self, x, ctx):
        return Done(x * 2)


class Wide(Scale):  # inherits forward: its base's code is its own
    pass


def times_100(self, x, ctx):
    return Done(x * 100)


def times_7(self, x, ctx):
    return Done(x * 7)


def cached(node, keeper):
    return Graph(keeper=keeper).node("n", node).cache("n")


def test_a_method_patched_on_the_node_class_is_a_new_key_for_the_running_and_a_new_graph():
    keeper, before = MemoryKeeper(), Scale.forward
    g = cached(Scale(), keeper)
    assert g.forward(3) == 6
    try:
        Scale.forward = times_100
        assert g.forward(3) == 300  # the running graph
        assert cached(Scale(), keeper).forward(3) == 300  # a new graph, same keeper
        Scale.forward = times_7  # patched again, with other code
        assert cached(Scale(), keeper).forward(3) == 21
    finally:
        Scale.forward = before
    rec = Recorder()
    assert Graph(keeper=keeper, watchers=[rec]).node("n", Scale()).cache("n").forward(3) == 6
    assert any(isinstance(e, CacheHit) for e in rec.events)  # back as it was: its entry


def test_a_method_patched_on_a_base_class_is_seen_by_its_subclass():
    keeper, before = MemoryKeeper(), Scale.forward
    g = cached(Wide(), keeper)
    assert g.forward(3) == 6
    try:
        Scale.forward = times_100
        assert g.forward(3) == 300
    finally:
        Scale.forward = before


def test_code_replaced_in_place_as_autoreload_does_is_a_new_key():
    class Shift(Node):
        def forward(self, x, ctx):
            return Done(x + 1)

    def edited(self, x, ctx):
        return Done(x + 50)

    keeper = MemoryKeeper()
    g = cached(Shift(), keeper)
    assert g.forward(3) == 4
    function = Shift.forward
    function.__code__ = edited.__code__  # the same function object, its code replaced
    assert Shift.forward is function
    assert g.forward(3) == 53
    assert cached(Shift(), keeper).forward(3) == 53


def helper(x):
    return x + 1


def test_a_run_key_follows_a_function_whose_code_is_replaced_in_place():
    def train(seed):
        return helper(seed) * 2

    def edited(seed):
        return helper(seed) * 3

    first = key_parts(train)
    train.__code__ = edited.__code__
    assert key_parts(train) != first


def test_a_function_patched_onto_the_class_enters_by_its_own_code_and_globals():
    me = sys.modules[__name__]
    keeper, before = MemoryKeeper(), Scale.forward

    def uses_helper(self, x, ctx):
        return Done(helper(x))

    try:
        Scale.forward = uses_helper
        g = cached(Scale(), keeper)
        assert g.forward(3) == 4
        me.helper = lambda x: x - 1  # a global the patched function reads, rebound
        assert g.forward(3) == 2
    finally:
        Scale.forward, me.helper = before, helper


def test_forward_replaced_on_the_instance_runs_in_the_same_graph_under_its_key():
    node, keeper = Scale(), MemoryKeeper()
    g = cached(node, keeper)
    assert g.forward(3) == 6
    node.forward = lambda x, ctx: Done(x * 3)
    assert g.forward(3) == 9  # the new forward runs, under the key that describes it
    assert cached(node, keeper).forward(3) == 9  # and its entry holds what it computed


def test_a_node_whose_class_is_changed_computes_as_its_new_class():
    class Other(Scale):
        def forward(self, x, ctx):
            return Done(x * 5)

    node, keeper = Scale(), MemoryKeeper()
    g = cached(node, keeper)
    assert g.forward(3) == 6
    node.__class__ = Other
    assert g.forward(3) == 15
    assert cached(node, keeper).forward(3) == 15


V1 = "from somatize import Done, Node\n\n\nclass Enc(Node):\n    def forward(self, x, ctx):\n        return Done(x * 1)\n"
V2 = V1.replace("x * 1", "x * 1000")


def test_a_source_file_edited_after_import_keys_the_code_that_runs(tmp_path, monkeypatch):
    path = tmp_path / "edited_enc.py"
    path.write_text(V1)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    module = importlib.import_module("edited_enc")
    try:
        running = module.Enc()  # this process runs v1
        path.write_text(V2)  # the file edited meanwhile, before its first key
        os.utime(path, (1, 1))
        v1_key = identity(running)
        importlib.reload(module)  # a process that imported v2
        v2_key = identity(module.Enc())
        assert module.Enc().forward(2, None).value == 2000
        assert running.forward(2, None).value == 2
        assert v1_key != v2_key  # v1's outputs are not stored under v2's key
        keeper = MemoryKeeper()
        assert cached(running, keeper).forward(2) == 2
        assert cached(module.Enc(), keeper).forward(2) == 2000
    finally:
        sys.modules.pop("edited_enc", None)


def test_an_edit_that_leaves_the_code_as_it_was_keeps_the_key(tmp_path, monkeypatch):
    path = tmp_path / "commented_enc.py"
    path.write_text(V1)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("commented_enc")
    try:
        path.write_text("# a comment above moves every line\n\n" + V1)
        moved = identity(module.Enc())
        path.write_text(V1)
        importlib.reload(module)
        assert identity(module.Enc()) == moved  # still read from the source: the same key
    finally:
        sys.modules.pop("commented_enc", None)


def test_an_unchanged_class_is_not_read_again_at_each_key(monkeypatch):
    import somatize.own_code as own_code

    reads = []
    real = own_code._read
    monkeypatch.setattr(own_code, "_read", lambda obj: reads.append(obj) or real(obj))

    class Fresh(Node):
        def forward(self, x, ctx):
            return Done(x + 1)

    g = cached(Fresh(), MemoryKeeper())
    for x in range(20):
        assert g.forward(x) == x + 1
    assert reads.count(Fresh) == 1


def test_bytecode_names_leave_out_the_locals_nested_code_shares():
    from somatize.source_code import code_names

    def embed(word):
        return [len(word) / (i + 1) for i in range(3)]  # `word`: a cell, not a global

    k = 2

    def scale(x):
        return [x * k for _ in range(2)]  # `k`: a closure from outside, read

    assert ["word"] not in code_names(embed.__code__)
    assert ["k"] in code_names(scale.__code__)


SEEN_SRC = "SEEN = []\n\n\nclass Counted:\n    def forward(self, x: int) -> int:\n        SEEN.append(x)\n        return x\n"


def test_code_compiled_under_its_callers_future_flags_is_still_read_from_its_source(tmp_path):
    path = tmp_path / "flagged.py"
    path.write_text(SEEN_SRC)
    module = types.ModuleType("flagged")
    module.__file__ = str(path)
    sys.modules["flagged"] = module
    try:  # as an exec of a file whose caller has `from __future__ import annotations`
        flags = __future__.annotations.compiler_flag
        exec(compile(SEEN_SRC, str(path), "exec", flags=flags), module.__dict__)
        assert _own(module.Counted)[2] == {"SEEN"}  # its source read: SEEN is its record
    finally:
        sys.modules.pop("flagged", None)
