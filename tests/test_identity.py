"""Keys: identity (code): the class and its module, helpers and their edits, comments, module
variables, library code, PYTHONHASHSEED, and two classes of one name."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from somatize import Ctx, Graph, MemoryKeeper, Recorder
from somatize.declaration import declaration
from somatize.identity import fingerprint, identity
from somatize.watchers import CacheHit, CacheMiss
from tests.identity_nodes import Embed, Writer, node_key

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
