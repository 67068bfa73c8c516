"""Keys: identity (code), declaration (arguments), state (holdings) and predecessor keys."""

from __future__ import annotations

import collections
import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from somatize import (
    Ctx,
    DeclarationError,
    Done,
    Graph,
    MemoryKeeper,
    Node,
    Recorder,
    key,
)
from somatize.declaration import declaration
from somatize.identity import fingerprint, identity
from somatize.memory import NodeKeys
from somatize.node_state import state
from somatize.watchers import CacheHit, CacheMiss
from tests.fakes import FakeCodec, FakeTensor

Writer = Callable[[str, str], ModuleType]


class Embed(Node):
    def __init__(self, dim: int = 5, *, scale: float = 1.0) -> None:
        self.dim = dim
        self.scale = scale

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done([x] * self.dim)


class Apply(Node):
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(self.fn(x))


CALLS: collections.Counter[int] = collections.Counter()  # outside the nodes: not their state
# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


class Holds(Node):
    """Holds a tensor-like weight: state the codec fingerprints."""

    def __init__(self) -> None:
        self.weight = FakeTensor(b"\x01" * 64)
        CALLS[id(self)] = 0  # a collected node's id may be reused: its count is not ours

    def forward(self, x: Any, ctx: Ctx) -> Done:
        CALLS[id(self)] += 1
        return Done(x + self.weight.data[0])


def node_key(impl: Any, preds: tuple[str, ...] = ("in",), codecs: Any = ()) -> str:
    return NodeKeys(codecs).of(impl, list(preds))


# -- declaration --------------------------------------------------------------------------


def test_different_arguments_give_different_keys() -> None:
    assert declaration(Embed(512)) != declaration(Embed(64))
    assert node_key(Embed(512)) != node_key(Embed(64))
    assert node_key(Embed(5, scale=2.0)) != node_key(Embed(5))


def test_arguments_are_bound_with_defaults_applied() -> None:
    assert declaration(Embed(5)) == declaration(Embed(dim=5)) == declaration(Embed())
    assert node_key(Embed(5)) == node_key(Embed(dim=5))


def test_node_and_function_arguments_enter_by_what_they_are() -> None:
    class Wrap(Node):
        def __init__(self, inner: Node) -> None:
            self.inner = inner

    assert declaration(Wrap(Embed(1))) != declaration(Wrap(Embed(2)))
    assert declaration(Wrap(Embed(1))) == declaration(Wrap(Embed(1)))

    def double(x: int) -> int:
        return 2 * x

    def triple(x: int) -> int:
        return 3 * x

    assert declaration(Apply(double)) != declaration(Apply(triple))
    assert declaration(Apply(len)) != declaration(Apply(abs))


def test_lambdas_written_on_one_line_are_told_apart() -> None:
    a, b = Apply(lambda x: x + 1), Apply(lambda x: x * 10)
    assert declaration(a) != declaration(b)
    g = Graph.somatize(Apply(lambda x: x + 1) | Apply(lambda x: x * 10))
    g.cache("apply").cache("apply_2")
    assert g.forward(2) == (3, 20)
    k = 3
    assert declaration(Apply(lambda x: x + k)) == declaration(Apply(lambda x: x + k))


def test_classes_made_by_a_factory_differ_by_their_closure() -> None:
    def make(k: int) -> type[Node]:
        class Mul(Node):
            def forward(self, x: Any, ctx: Ctx) -> Done:
                return Done(x * k)

        return Mul

    assert identity(make(2)()) != identity(make(3)())
    assert identity(make(2)()) == identity(make(2)())
    g = Graph.somatize(make(2)() | make(3)())
    g.cache("mul").cache("mul_2")
    assert g.forward(5) == (10, 15)


def test_an_undeclarable_argument_fails_only_when_a_key_is_needed() -> None:
    class Bag(Node):
        def __init__(self, items: Any) -> None:
            self.items = items

        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x)

    assert Graph().node("bag", Bag(iter([1, 2]))).forward(1) == 1  # uncached: no key, runs fine
    g = Graph().node("bag", Bag(iter([1, 2]))).cache("bag")
    with pytest.raises(DeclarationError) as info:
        g.forward(1)
    msg = str(info.value)
    assert "node 'bag'" in msg and "'items' of" in msg and "list_iterator" in msg
    assert "do not cache" in msg
    with pytest.raises(DeclarationError, match=r"dict key \(1, 2\).*str or int"):
        Graph().node("bag", Bag({(1, 2): 3})).cache("bag").forward(1)
    # an uncached node feeding a cached one needs a key too
    g = Graph.somatize(Bag(object()) >> Embed(1)).cache("embed")
    with pytest.raises(DeclarationError, match=r"node 'bag' needs a key .*feeds"):
        g.forward(1)
    assert isinstance(info.value, TypeError)


# -- identity -----------------------------------------------------------------------------


def test_identity_names_the_class_and_the_versions() -> None:
    ident = identity(Embed())
    assert ident.startswith(f"{Embed.__module__}.Embed:")
    assert "somatize=" in ident and "torch=" in ident
    assert identity(Embed(1)) == identity(Embed(2))  # arguments are the declaration's business


def test_two_classes_named_embed_in_two_modules_never_collide(user_module: Writer) -> None:
    source = """
        from somatize import Node, Done
        class Embed(Node):
            def __init__(self, dim):
                self.dim = dim
            def forward(self, x, ctx):
                return Done([x, self.dim])
    """
    a, b = user_module("models_a", source), user_module("models_b", source)
    assert identity(a.Embed(4)) != identity(b.Embed(4))
    assert node_key(a.Embed(4)) != node_key(b.Embed(4))
    # sharing one keeper, the second class never reads the first one's entries
    keeper, rec = MemoryKeeper(), Recorder()
    Graph(keeper=keeper, watchers=[rec]).node("e", a.Embed(4)).cache("e").forward(1)
    Graph(keeper=keeper, watchers=[rec]).node("e", b.Embed(4)).cache("e").forward(1)
    assert len(rec.of(CacheMiss)) == 2 and not rec.of(CacheHit)


NODE_MODULE = """
    from somatize import Node, Done
    import shapes

    def helper(x):
        # the helper the node calls
        return {body}

    def indirect(x):
        return helper(x)

    class Embed(Node):
        \"\"\"Embeds.\"\"\"

        def forward(self, x, ctx):
            return Done([indirect(x), shapes.scale(x)])
"""
SHAPES = """
    def scale(x):
        return x * {factor}
"""


def test_editing_a_helper_changes_the_key(user_module: Writer) -> None:
    user_module("shapes", SHAPES.format(factor=2))
    mod = user_module("nodes_h", NODE_MODULE.format(body="x + 1"))
    before = node_key(mod.Embed())
    mod = user_module("nodes_h", NODE_MODULE.format(body="x + 2"))  # edit, then reload
    after = node_key(mod.Embed())
    assert before != after
    assert mod.Embed().forward(1, Ctx("e")).value == [3, 2]  # the new code is running


def test_an_edit_of_the_same_size_in_the_same_mtime_tick_is_seen(user_module: Writer) -> None:
    user_module("shapes", SHAPES.format(factor=2))
    mod = user_module("nodes_tick", NODE_MODULE.format(body="x + 1"))
    before = node_key(mod.Embed())
    file = Path(mod.__file__)
    stamp = file.stat()
    file.write_text(file.read_text().replace("x + 1", "x + 7"))  # same size
    os.utime(file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as if in the same tick
    mod = importlib.reload(mod)
    assert mod.Embed().forward(1, Ctx("e")).value == [8, 2]
    assert node_key(mod.Embed()) != before


def test_editing_a_helper_module_reloaded_alone_changes_the_key(user_module: Writer) -> None:
    user_module("shapes", SHAPES.format(factor=2))
    mod = user_module("nodes_r", NODE_MODULE.format(body="x"))
    before = node_key(mod.Embed())
    user_module("shapes", SHAPES.format(factor=3))  # only the helper's module is reloaded
    assert node_key(mod.Embed()) != before


def test_editing_comments_and_docstrings_keeps_the_key(user_module: Writer) -> None:
    user_module("shapes", SHAPES.format(factor=2))
    mod = user_module("nodes_c", NODE_MODULE.format(body="x + 1"))
    before = node_key(mod.Embed())
    edited = NODE_MODULE.format(body="x + 1  # still one").replace('"""Embeds."""', '"""Other."""')
    edited = edited.replace("# the helper the node calls", "# reworded comment, longer")
    mod = user_module("nodes_c", edited)
    assert node_key(mod.Embed()) == before


def test_fresh_module_name_with_edited_helper_differs(user_module: Writer) -> None:
    user_module("shapes", SHAPES.format(factor=2))
    one = user_module("nodes_v1", NODE_MODULE.format(body="x + 1"))
    same = user_module("nodes_v1b", NODE_MODULE.format(body="x + 1"))
    two = user_module("nodes_v2", NODE_MODULE.format(body="x - 1"))
    f1, f2 = fingerprint(one.Embed), fingerprint(two.Embed)
    assert f1 != f2
    assert fingerprint(same.Embed) != f1  # module names differ, so identities differ too


def test_module_variables_named_like_locals_stay_out_of_the_key(user_module: Writer) -> None:
    mod = user_module(
        "nodes_locals",
        """
        from somatize import Node, Done
        word, total, y = "alpha", 0, 1  # a script's loop variables, say
        class Count(Node):
            def __init__(self, fn):
                self.fn = fn
            def forward(self, word, ctx):
                total = len(word)
                return Done([self.fn(total)] + [y for y in word])
        def make():
            return Count(lambda y: y + 1)
        """,
    )
    node = mod.make()
    before = identity(node), declaration(node)
    mod.word, mod.total, mod.y = "beta", 5, 2
    node = mod.make()
    assert (identity(node), declaration(node)) == before
    mod.Done = None  # a global it does read: the key follows
    assert identity(mod.make()) != before[0]


def test_library_code_enters_by_name(user_module: Writer) -> None:
    mod = user_module(
        "nodes_lib",
        """
        import json
        from somatize import Node, Done
        class Dump(Node):
            def forward(self, x, ctx):
                return Done(json.dumps(x))
        """,
    )
    assert fingerprint(mod.Dump) == fingerprint(mod.Dump)
    assert node_key(mod.Dump()) == node_key(mod.Dump())


@pytest.mark.slow
def test_keys_do_not_depend_on_pythonhashseed(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    (tmp_path / "stable_nodes.py").write_text(
        textwrap.dedent(
            """
            from somatize import Node, Done
            TABLE = {"b": 2, "a": 1}
            def helper(x):
                return x in {"alpha", "beta", "gamma", "delta"}
            class Pick(Node):
                def __init__(self, fn, table):
                    self.fn, self.table = fn, table
                def forward(self, x, ctx):
                    return Done(helper(x) and TABLE)
            """
        )
    )
    script = """
import json, sys
sys.path.insert(0, sys.argv[1])
import stable_nodes
from somatize.memory import NodeKeys
from somatize.watchers import CacheHit, CacheMiss
words = {"w%d" % i for i in range(20)}
node = stable_nodes.Pick(lambda x: x in {"p", "q", "r", "s", "t"}, {w: 1 for w in words})
print(json.dumps(NodeKeys().of(node, ["input-key"])))
"""
    keys = {
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            env={**subprocess_env, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(keys) == 1
    assert len(json.loads(keys.pop())) == 64


# -- state --------------------------------------------------------------------------------


def test_data_state_enters_the_key() -> None:
    e = Embed(3)
    before = node_key(e)
    e.dim = 4
    assert node_key(e) != before
    assert state(Embed(3)) == state(Embed(3))


def test_a_frozen_nodes_state_is_hashed_once_and_changes_are_still_seen() -> None:
    codec = FakeCodec()
    node = Holds()
    rec = Recorder()
    g = Graph(codecs=[codec], watchers=[rec]).node("h", node).freeze("h").cache("h")
    for x in range(5):
        assert g.forward(x) == x + 1
    assert g.forward(0) == 1  # a hit
    assert CALLS[id(node)] == 5
    assert codec.hashed == 1  # the weight's digest was computed once...
    assert codec.remembered >= 5  # ...and served from the codec's memo afterwards
    node.weight.add_(1)  # state changed in place: the key must follow
    assert g.forward(0) == 2
    assert CALLS[id(node)] == 6
    assert codec.hashed == 2
    assert [type(e) for e in rec.events if isinstance(e, (CacheHit, CacheMiss))][-2:] == [
        CacheHit,
        CacheMiss,
    ]


def test_a_cached_node_is_rekeyed_when_its_state_changes() -> None:
    codec = FakeCodec()
    node = Holds()
    g = Graph(codecs=[codec]).node("h", node).cache("h")
    assert g.forward(1) == 2 and g.forward(1) == 2
    assert CALLS[id(node)] == 1
    node.weight = FakeTensor(b"\x07" * 64)  # replaced, not modified in place
    assert g.forward(1) == 8
    assert CALLS[id(node)] == 2


# -- the key function ---------------------------------------------------------------------


def test_key_is_a_pure_function_of_its_four_parts() -> None:
    base = key("id", "decl", "state", ["k1", "k2"])
    assert base == key("id", "decl", "state", ["k1", "k2"])
    assert (
        len(
            {
                base,
                key("id2", "decl", "state", ["k1", "k2"]),
                key("id", "decl2", "state", ["k1", "k2"]),
                key("id", "decl", "state2", ["k1", "k2"]),
                key("id", "decl", "state", ["k2", "k1"]),  # edge order matters
                key("id", "decl", "state", ["k1"]),
            }
        )
        == 6
    )


def test_a_subgraphs_key_covers_its_nodes() -> None:
    def outer(dim: int) -> Graph:
        return Graph().node("sub", Graph.somatize(Embed(dim) >> Embed(1)))

    keys = NodeKeys()
    assert keys.of(outer(2)["sub"], ["x"]) == keys.of(outer(2)["sub"], ["x"])
    assert keys.of(outer(2)["sub"], ["x"]) != keys.of(outer(3)["sub"], ["x"])


def test_two_classes_of_one_name_in_one_file_have_their_own_fingerprints(tmp_path) -> None:
    """Python 3.11's inspect.getsource finds the first class of a name in a file: the
    second must not be fingerprinted by the first one's source."""
    import importlib.util

    path = tmp_path / "variants.py"
    path.write_text(
        "from somatize import Done, Node\n\n\n"
        "class Enc(Node):\n    def forward(self, x, ctx):\n        return Done(x + 1)\n\n\n"
        "First = Enc\n\n\n"
        "class Enc(Node):\n    def forward(self, x, ctx):\n        return Done(x * 2)\n\n\n"
        "Second = Enc\n"
    )
    spec = importlib.util.spec_from_file_location("somatize_test_variants", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (inspect finds a class's source through its module)
    try:
        spec.loader.exec_module(mod)
        assert fingerprint(mod.First) != fingerprint(mod.Second)
        assert identity(mod.First()) != identity(mod.Second())
    finally:
        del sys.modules[spec.name]
