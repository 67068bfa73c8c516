"""The bad-input catalogue (core): every bad input is a clear error naming what is wrong.

Each case feeds one bad input to the public API and asserts the error class (a
``SomatizeError`` subclass, or the built-in the API documents) and a message that
names the offending value. The torch half is ``tests/torch/test_bad_inputs_torch.py``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from somatize import (
    CacheError,
    CrossingError,
    CycleError,
    DiskKeeper,
    Done,
    DuplicateNodeError,
    EmptyGraphError,
    Graph,
    GraphError,
    JsonLines,
    KeeperError,
    MemoryKeeper,
    MissingNodeError,
    MissingValueError,
    Node,
    NodeError,
    Opaque,
    Topology,
    TransportError,
    ValueConversionError,
    digest,
    encode,
)
from somatize.transports import ExecutorTransport, InProcess
from somatize.values import check


class Inc(Node):
    def forward(self, x, ctx):
        return Done(x + 1)


class Wrap(Node):
    def forward(self, x, ctx):
        return Done(Opaque(x))


class NoDone(Node):
    def forward(self, x, ctx):
        return x


class GivesSet(Node):
    def forward(self, x, ctx):
        return Done({1, 2})


class GivesObject(Node):
    def forward(self, x, ctx):
        return Done(object())


class TwoInputs(Node):
    def forward(self, x, y, ctx):  # one argument per input: they come as one tuple x
        return Done(x + y)


class MyInt(int):
    pass


class MyStr(str):
    pass


class ReadsLr(Node):
    def forward(self, x, ctx):
        return Done(x * ctx.values["lr"])


def one() -> Graph:
    return Graph.somatize(Inc())  # the node's id: "inc"


def chain() -> Graph:
    g = Graph()
    g.node("a", Inc())
    g.node("b", Inc())
    g.edge("a", "b")
    return g


def recursive() -> list[Any]:
    x: list[Any] = [1]
    x.append(x)
    return x


def keeper(tmp: Path) -> DiskKeeper:
    return DiskKeeper(tmp / "cache")


K = "a" * 64  # a well-formed key
P = pytest.param
# fmt: off
CASES = [
    # -- values: what can cross an edge as data --------------------------------------
    P(lambda t: encode({1, 2}), ValueConversionError, r"a set; .*sorted", id="encode-set"),
    P(lambda t: encode(frozenset()), ValueConversionError, "a frozenset", id="encode-frozenset"),
    P(lambda t: encode(object()), ValueConversionError, "type object", id="encode-object"),
    P(lambda t: encode(x for x in ()), ValueConversionError, "a generator", id="encode-generator"),
    P(lambda t: encode(bytearray(b"x")), ValueConversionError, "a bytearray", id="encode-bytearray"),
    P(lambda t: encode(memoryview(b"x")), ValueConversionError, "a memoryview", id="encode-memoryview"),
    P(lambda t: encode({1.5: 1}), ValueConversionError, "dict key 1.5 of type float", id="encode-float-key"),
    P(lambda t: encode({(1,): 1}), ValueConversionError, r"dict key \(1,\)", id="encode-tuple-key"),
    P(lambda t: encode({None: 1}), ValueConversionError, "dict key None", id="encode-none-key"),
    P(lambda t: encode({"a": [1, {2}]}), ValueConversionError, r"at \['a'\]\[1\]: .*a set", id="encode-nested-set"),
    P(lambda t: encode(MyInt(3)), ValueConversionError, "MyInt, a subclass of int", id="encode-int-subclass"),
    P(lambda t: encode(MyStr("x")), ValueConversionError, "MyStr, a subclass of str", id="encode-str-subclass"),
    P(lambda t: encode([Opaque(1)]), ValueConversionError, r"at \[0\]: .*Opaque inside", id="encode-opaque-inside"),
    P(lambda t: encode(recursive()), ValueConversionError, "contains itself", id="encode-recursive"),
    P(lambda t: digest(recursive()), ValueConversionError, "contains itself", id="digest-recursive"),
    P(lambda t: check(recursive(), where="output of node 'x'"), ValueConversionError, r"node 'x'.*contains itself", id="check-recursive"),
    P(lambda t: encode({"k": recursive()}), ValueConversionError, "contains itself", id="encode-recursive-inside"),
    P(lambda t: digest({3}), ValueConversionError, "a set", id="digest-set"),
    P(lambda t: check(object(), where="output of node 'x'"), ValueConversionError, r"output of node 'x'.*object", id="check-object"),
    P(lambda t: encode(1j), ValueConversionError, "type complex", id="encode-complex"),
    P(lambda t: encode(range(3)), ValueConversionError, "type range", id="encode-range"),
    P(lambda t: encode(Path("x")), ValueConversionError, "PosixPath|WindowsPath", id="encode-path"),
    P(lambda t: encode(Ellipsis), ValueConversionError, "ellipsis", id="encode-ellipsis"),
    P(lambda t: encode(print), ValueConversionError, "builtin_function_or_method", id="encode-function"),
    P(lambda t: encode(type), ValueConversionError, "type type", id="encode-class"),
    P(lambda t: pickle.dumps(Opaque(1)), ValueConversionError, r"Opaque\(int\) cannot be pickled", id="opaque-pickle"),
    # -- nodes: the contract of forward ----------------------------------------------
    P(lambda t: Graph.somatize(NoDone()).forward(1), NodeError, r"node 'no_done'.*returned int instead of Done", id="node-no-done"),
    P(lambda t: Graph.somatize(GivesSet()).forward(1), ValueConversionError, r"output of node 'gives_set'.*a set", id="node-gives-set"),
    P(lambda t: Graph.somatize(GivesObject()).forward(1), ValueConversionError, r"node 'gives_object'.*type object", id="node-gives-object"),
    P(lambda t: Graph.somatize(Inc().mapped()).forward(3), NodeError, r"mapped node 'inc' received a int", id="mapped-not-a-list"),
    # -- graphs: building ----------------------------------------------------------
    P(lambda t: one().node("inc", Inc()), DuplicateNodeError, "'inc'", id="node-duplicate"),
    P(lambda t: Graph().node("a", 42), TypeError, "node 'a': int is not a Node or Graph", id="node-not-a-node"),
    P(lambda t: Graph().node("a", Inc), TypeError, "node 'a'", id="node-a-class"),
    P(lambda t: Graph().node(3, Inc()), GraphError, "node id 3", id="node-id-int"),
    P(lambda t: Graph().node("", Inc()), GraphError, "node id ''", id="node-id-empty"),
    P(lambda t: one().edge("nope", "inc"), MissingNodeError, "no node 'nope'.*nodes: inc", id="edge-missing-source"),
    P(lambda t: one().edge("inc", "nope"), MissingNodeError, "no node 'nope'", id="edge-missing-target"),
    P(lambda t: Graph().edge("a", "b"), MissingNodeError, "no node 'a'", id="edge-empty-graph"),
    P(lambda t: one().edge("inc", "inc"), CycleError, "'inc' -> 'inc'", id="edge-self-loop"),
    P(lambda t: chain().edge("b", "a"), CycleError, r"(a -> b -> a|b -> a -> b)", id="edge-cycle"),
    P(lambda t: Graph().forward(1), EmptyGraphError, "no nodes", id="forward-empty-graph"),
    P(lambda t: Graph.somatize(42), TypeError, "cannot compose a int", id="somatize-int"),
    P(lambda t: Graph.somatize("x"), TypeError, "cannot compose a str", id="somatize-str"),
    P(lambda t: Inc() >> 3, TypeError, "cannot compose a int", id="rshift-int"),
    P(lambda t: Inc() | None, TypeError, "cannot compose a NoneType", id="or-none"),
    P(lambda t: 3 >> Inc(), TypeError, "cannot compose a int", id="rrshift-int"),
    P(lambda t: Graph.somatize(Inc().with_id("a") >> Inc().with_id("a")), DuplicateNodeError, "'a'", id="dsl-duplicate-ids"),
    P(lambda t: Graph.somatize(Inc().with_id("")), GraphError, "''", id="dsl-empty-id"),
    # -- graphs: memory settings and placement -------------------------------------
    P(lambda t: one().freeze("zz"), MissingNodeError, "no node 'zz'", id="freeze-missing"),
    P(lambda t: one().cache("zz"), MissingNodeError, "no node 'zz'", id="cache-missing"),
    P(lambda t: one().name("zz", "n"), MissingNodeError, "no node 'zz'", id="name-missing"),
    P(lambda t: one().pin("zz"), MissingNodeError, "no node 'zz'", id="pin-missing"),
    P(lambda t: one().place("zz", host="h"), MissingNodeError, "no node 'zz'", id="place-missing"),
    P(lambda t: Graph.somatize(Wrap() >> Inc()).cache("inc").forward(1), CacheError, r"'inc'.*'wrap'", id="cache-after-opaque"),
    P(lambda t: one().place("inc", host="box").forward(1), TransportError, "'box'", id="host-without-transport"),
    P(lambda t: one().place("inc", host="box").forward(1, transports=["box"]), TypeError, r"transports=\['box'\] is a list; it maps each host", id="transports-a-list"),
    P(lambda t: (Graph.somatize(Wrap() >> Inc().with_id("far")) .place("far", host="box") .forward(1, transports={"box": InProcess()}) ), CrossingError, "'wrap'.*'far'|'far'.*'wrap'", id="opaque-crossing-hosts"),
    # -- graphs: inputs -----------------------------------------------------------
    P(lambda t: one().forward({1}), ValueConversionError, "the graph input: .*a set", id="forward-set"),
    P(lambda t: one().forward(recursive()), ValueConversionError, "graph input.*contains itself", id="forward-recursive"),
    P(lambda t: one().forward(object()), ValueConversionError, "graph input.*type object", id="forward-object"),
    P(lambda t: one().forward([1, {2: {3}}]), ValueConversionError, r"graph input at \[1\]\[2\]", id="forward-nested-set"),
    P(lambda t: one().forward(Opaque(1), {1, 2}), ValueConversionError, r"graph input 1 \(beside an Opaque one\).*a set", id="forward-set-beside-opaque"),
    P(lambda t: Graph.somatize(ReadsLr()).forward(1), MissingValueError, r"ctx\.values\['lr'\]: this run was given no values; pass it as g\.forward\(x, values=\{'lr': \.\.\.\}\)", id="ctx-values-missing"),
    P(lambda t: Graph.somatize(ReadsLr()).forward(1, values={"momentum": 0.9, "l_r": 0.1}), MissingValueError, r"ctx\.values\['lr'\]: this run was given values for 'l_r', 'momentum' but not 'lr'; add it: g\.forward\(x, values=\{\.\.\., 'lr': \.\.\.\}\)", id="ctx-values-other-given"),
    P(lambda t: Graph(codecs=3), TypeError, r"Graph\(codecs=\.\.\.\): codecs is a sequence of codecs, not 3; e\.g\. codecs=\[st\.TensorCodec\(\)\]", id="graph-codecs-int"),
    P(lambda t: Graph(codecs=[3]), TypeError, r"Graph\(codecs=\.\.\.\): 3 is not a codec: it lacks tag \(a str\), accepts, .*see somatize\.codecs\.Codec", id="graph-codecs-list-of-int"),
    P(lambda t: one().use(codecs=[object()]), TypeError, r"Graph\.use\(codecs=\.\.\.\): <object object .*> is not a codec", id="graph-use-codecs-object"),
    P(lambda t: MemoryKeeper().put("ab" * 32, "str"), TypeError, r"MemoryKeeper\.put: the value of 'abab.*' is 'str'; a keeper stores bytes, not str; encode the value first, e\.g\. somatize\.encode\(value\)", id="memory-keeper-put-str"),
    P(lambda t: MemoryKeeper().put("ab" * 32, 3), TypeError, r"MemoryKeeper\.put: the value of 'abab.*' is 3; a keeper stores bytes, not int", id="memory-keeper-put-int"),
    P(lambda t: MemoryKeeper().put_many([("ab" * 32, [1, 2])]), TypeError, r"MemoryKeeper\.put_many: the value of 'abab.*' is \[1, 2\]; a keeper stores bytes, not list", id="memory-keeper-put-many-list"),
    P(lambda t: keeper(t).put("ab" * 32, "str"), TypeError, r"DiskKeeper\.put: the value of 'abab.*' is 'str'; a keeper stores bytes, not str", id="disk-keeper-put-str"),
    P(lambda t: keeper(t).put_many([("ab" * 32, None)]), TypeError, r"DiskKeeper\.put_many: the value of 'abab.*' is None; a keeper stores bytes, not NoneType", id="disk-keeper-put-many-none"),
    P(lambda t: one().forward(1, values=[1]), TypeError, r"values=\[1\]\): values is a mapping", id="forward-values-list"),
    # -- graphs: constructor, names, flags, the DSL (audit: S11, M5, C5, C6, M1, section 5)
    P(lambda t: Graph(keeper=42), TypeError, r"Graph\(keeper=\.\.\.\): 42 \(int\) is not a keeper", id="graph-keeper-int"),
    P(lambda t: Graph(watchers=[print]), TypeError, r"Graph\(watchers=\.\.\.\): <built-in function print> is not a watcher", id="graph-watchers-print"),
    P(lambda t: Graph(watchers=print), TypeError, "watchers is a list of watchers, not a builtin_function", id="graph-watchers-not-a-list"),
    P(lambda t: chain().name("a", "same").name("b", "same"), GraphError, r"g.name\('b', 'same'\): node 'a' already has that name", id="name-twice"),
    P(lambda t: chain().name("a", "Feats").name("b", "feats"), GraphError, r"g.name\('b', 'feats'\): node 'a' is named 'Feats', which differs only in case: on macOS and Windows", id="name-case-only"),
    P(lambda t: one().name("inc", 5), GraphError, r"g.name\('inc', 5\): a name is a str", id="name-int"),
    P(lambda t: one().name("inc", ""), GraphError, r"g.name\('inc', ''\)", id="name-empty"),
    P(lambda t: one().name("inc", "a b"), GraphError, r"g.name\('inc', 'a b'\)", id="name-space"),
    # found by an outside audit: "." and ".." broke the store, ".v1" was a hidden file no
    # listing showed, ".x.tmp" one gc took for a temporary, "v1\n" a file name with a newline
    *(
        P(lambda t, n=n: one().name("inc", n), GraphError, "the first not '.'", id=f"name-{i}")
        for i, n in enumerate([".", "..", ".v1", ".model.tmp", "v1\n"])
    ),
    P(lambda t: one().freeze("inc", "no"), GraphError, r"g.freeze\('inc', 'no'\): on is True or False", id="freeze-truthy-str"),
    P(lambda t: one().cache("inc", 1), GraphError, r"g.cache\('inc', 1\)", id="cache-int-flag"),
    P(lambda t: Graph().node(" ", Inc()), GraphError, "node id ' '", id="node-id-blank"),
    P(lambda t: Graph().node("two", TwoInputs()), NodeError, r"node 'two': TwoInputs.forward\(self, x, y, ctx\) takes 3 arguments.*x, y = x", id="node-one-argument-per-input"),
    P(lambda t: Graph.somatize((n := Inc()) >> n), CycleError, "'inc' is written twice.*use two instances", id="dsl-instance-feeds-itself"),
    P(lambda t: Graph.somatize((n := Inc()) >> Wrap() >> n), CycleError, "'inc' is written twice.*feed itself", id="dsl-instance-two-cycle"),
    P(lambda t: Graph.somatize(Wrap() >> ((n := Inc()) | n)), GraphError, "'inc' is written twice side by side.*use two instances", id="dsl-instance-side-by-side"),
    # -- topology ---------------------------------------------------------------------
    P(lambda t: Topology(nodes=("a"), edges=(("a", "b"),)), MissingNodeError, "'b'", id="topology-edge-to-nowhere"),
    P(lambda t: Topology(nodes=("a", "b"), edges=(("a", "b"), ("b", "a"))), CycleError, "a -> b -> a", id="topology-cycle"),
    P(lambda t: Topology(nodes=("a", "a"), edges=()), DuplicateNodeError, "'a'", id="topology-duplicate"),
    P(lambda t: Topology.from_dict(3), TypeError, r"Topology\.from_dict takes a dict as to_dict writes it, not 3; e\.g\. \{'nodes'", id="topology-from-int"),
    P(lambda t: Topology.from_dict({"nodes": ["a"]}), GraphError, r"Topology\.from_dict: the dict has no 'edges' \(it has 'nodes'\); a topology is", id="topology-no-edges"),
    P(lambda t: Topology.from_dict({"nodes": ["a", "b"], "edges": ["ab"]}), GraphError, r"edge 'ab' in 'edges' is not a \[source, target\] pair of node ids; e\.g\. 'edges': \[\['a', 'b'\]\]", id="topology-str-edge"),
    P(lambda t: Topology.from_dict({"nodes": "ab", "edges": []}), GraphError, r"'nodes' is 'ab', not a list of node ids", id="topology-str-nodes"),
    P(lambda t: Topology.from_dict({"nodes": [1], "edges": []}), GraphError, "node id 1", id="topology-int-id"),
    P(lambda t: Topology(nodes=(), edges=()).require_nonempty(), EmptyGraphError, "no nodes", id="topology-empty"),
    # -- keepers ----------------------------------------------------------------------
    P(lambda t: MemoryKeeper().put("nothex", b"x"), KeeperError, "invalid key 'nothex'", id="memory-bad-key"),
    P(lambda t: DiskKeeper(None), TypeError, r"DiskKeeper\(None\): the cache directory is a path .*'\.somatize-cache'", id="disk-none"),
    P(lambda t: DiskKeeper(3), TypeError, r"DiskKeeper\(3\): .*got int", id="disk-int"),
    P(lambda t: keeper(t).put("../etc", b"x"), KeeperError, r"invalid key '\.\./etc'", id="disk-put-traversal"),
    P(lambda t: keeper(t).put("A" * 64, b"x"), KeeperError, "invalid key 'AAAA", id="disk-put-upper"),
    P(lambda t: keeper(t).put("a" * 63, b"x"), KeeperError, "invalid key 'aaa", id="disk-put-short"),
    P(lambda t: keeper(t).get("ZZ"), KeeperError, "invalid key 'ZZ'", id="disk-get-bad-key"),
    P(lambda t: keeper(t).pin("x/y"), KeeperError, "invalid key 'x/y'", id="disk-pin-bad-key"),
    P(lambda t: keeper(t).name("../x", K), KeeperError, r"invalid name '\.\./x'", id="disk-name-traversal"),
    P(lambda t: keeper(t).name("ok", "zz"), KeeperError, "invalid key 'zz'", id="disk-name-bad-key"),
    P(lambda t: keeper(t).lookup(""), KeeperError, "invalid name ''", id="disk-lookup-empty"),
    P(lambda t: keeper(t).get_many([None]), KeeperError, "invalid key None", id="disk-get-many-none"),
    P(lambda t: keeper(t).name("a" * 201, K), KeeperError, "invalid name 'aaaa", id="disk-name-too-long"),
    # -- transports -------------------------------------------------------------------
    P(lambda t: ExecutorTransport(ThreadPoolExecutor(1), retries=-1), ValueError, "retries=-1", id="transport-retries"),
    P(lambda t: ExecutorTransport(ThreadPoolExecutor(1), retries=1.5), ValueError, "retries=1.5", id="transport-retries-float"),
    P(lambda t: ExecutorTransport(42), TypeError, "not 42", id="transport-not-an-executor"),
    P(lambda t: ExecutorTransport(ThreadPoolExecutor(1), timeout=0), ValueError, "timeout=0", id="transport-timeout-zero"),
    P(lambda t: ExecutorTransport(ThreadPoolExecutor(1), timeout=-5.0), ValueError, "timeout=-5.0", id="transport-timeout-negative"),
]
# fmt: on


@pytest.mark.parametrize(("bad", "error", "names"), CASES)
def test_a_bad_input_is_a_clear_error_naming_it(
    tmp_path: Path, bad: Callable[[Path], Any], error: type[BaseException], names: str
) -> None:
    with pytest.raises(error, match=names) as info:
        bad(tmp_path)
    from somatize.errors import SomatizeError

    # our own errors are SomatizeErrors; a built-in is only where the API documents one
    if not isinstance(info.value, SomatizeError):
        assert type(info.value) in (TypeError, ValueError), type(info.value)


def test_the_catalogue_is_large():
    assert len(CASES) >= 70


def test_disk_keeper_refuses_an_empty_path_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"DiskKeeper\(''\): .*empty path"):
        DiskKeeper("")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("max_bytes", [-5, -1, 1.5, "1GB", True])
def test_disk_keeper_gc_refuses_a_size_below_0_and_keeps_every_entry(
    tmp_path: Path, max_bytes: Any
) -> None:
    keeper = DiskKeeper(tmp_path / "cache")
    keeper.put("a" * 64, encode("x" * 50))
    with pytest.raises(ValueError, match=r"DiskKeeper\.gc\(max_bytes=.*0 or more"):
        keeper.gc(max_bytes)
    assert keeper.get("a" * 64) == encode("x" * 50)


@pytest.mark.parametrize("max_bytes", ["1GB", -1, 0, 1.5, None])
def test_memory_keeper_refuses_a_budget_that_is_not_a_positive_int(max_bytes: Any) -> None:
    with pytest.raises(ValueError, match=r"MemoryKeeper\(max_bytes=.*an int of 1 or more"):
        MemoryKeeper(max_bytes=max_bytes)


def test_jsonlines_given_a_directory_names_it_and_a_file_to_pass(tmp_path: Path) -> None:
    # an OSError as before (the one the OS raised on the first event), now at construction
    with pytest.raises(IsADirectoryError, match=r"JsonLines takes the path of a log file, and "):
        JsonLines(tmp_path)
    try:
        JsonLines(tmp_path)
    except IsADirectoryError as e:
        assert f"pass a file in it, e.g. JsonLines({str(tmp_path / 'events.jsonl')!r})" in str(e)
