"""What a node class's code reads is checked at every key (``somatize/bindings.py``): a
global rebound in the same process — a helper redefined in a notebook cell, a constant
set anew — or a global tensor or module changed in place is seen by the running graph,
not only by a new one."""

from __future__ import annotations

import sys

import pytest

from somatize import Done, Graph, MemoryKeeper, Node

FACTOR = 2
CFG = {"scale": 2.0, "shift": [0.0, 1.0], "tags": {"a"}}


def bump(x):
    return x + 1


class Weigh(Node):
    def forward(self, x, ctx):
        return Done(bump(x) * FACTOR)


def weighed(x):
    return x * FACTOR


class Holds(Node):
    """Holds a function (a node given its transform): the function's globals count too."""

    def __init__(self, fn):
        self.fn = fn

    def forward(self, x, ctx):
        return Done(self.fn(x))


def test_a_global_rebound_or_a_helper_redefined_is_seen_by_the_running_graph():
    me, helper = sys.modules[__name__], bump
    g = Graph(keeper=MemoryKeeper()).node("w", Weigh()).cache("w")
    assert g.forward(3) == 8
    try:
        me.FACTOR = 10
        assert g.forward(3) == 40
        me.bump = lambda x: x - 1  # (as `def bump` run again in a notebook)
        assert g.forward(3) == 20
    finally:
        me.FACTOR, me.bump = 2, helper
    assert g.forward(3) == 8  # back as it was: the first entry's key again


def test_a_global_read_by_a_function_the_node_holds_is_seen_when_rebound():
    me = sys.modules[__name__]
    g = Graph(keeper=MemoryKeeper()).node("h", Holds(weighed)).cache("h")
    assert g.forward(3) == 6
    try:
        me.FACTOR = 7
        assert g.forward(3) == 21
    finally:
        me.FACTOR = 2


def test_a_closure_variable_set_anew_is_seen():
    k = 2

    class Times(Node):
        def forward(self, x, ctx):
            return Done(x * k)

    g = Graph(keeper=MemoryKeeper()).node("t", Times()).cache("t")
    assert g.forward(3) == 6
    k = 5
    assert g.forward(3) == 15


def test_a_global_tensor_written_in_place_or_a_global_module_loaded_anew_is_seen():
    torch = pytest.importorskip("torch")
    import somatize.torch as st

    me = sys.modules[__name__]
    me.SHIFT = torch.zeros(3)
    me.NET = torch.nn.Linear(3, 3)
    try:

        class Centre(Node):
            rowwise = True

            def forward(self, x, ctx):
                return Done(NET(x - SHIFT).detach())  # noqa: F821  (set above)

        g = Graph(keeper=MemoryKeeper()).node("c", Centre()).cache("c", per="example")
        st.module(g)
        x = torch.ones(2, 3)
        g.forward(x)
        with torch.no_grad():
            me.SHIFT.add_(1.0)
            expected = me.NET(x - 1.0)
        assert torch.equal(g.forward(x), expected)
        me.NET.load_state_dict(torch.nn.Linear(3, 3).state_dict())
        with torch.no_grad():
            expected = me.NET(x - 1.0)
        assert torch.equal(g.forward(x), expected)
    finally:
        del me.SHIFT, me.NET


class Configured(Node):
    def forward(self, x, ctx):
        return Done(x * CFG["scale"] + CFG["shift"][1] + len(CFG["tags"]))


def test_a_global_dict_or_list_of_plain_values_changed_in_place_is_seen():
    # a notebook's CFG["scale"] = 3.0 kept serving the entry of scale 2.0: the dict is
    # bound as it was, and its content was read only when the class was first keyed
    saved = {"scale": CFG["scale"], "shift": list(CFG["shift"]), "tags": set(CFG["tags"])}
    g = Graph(keeper=MemoryKeeper()).node("c", Configured()).cache("c")
    assert g.forward(3) == 8.0
    try:
        CFG["scale"] = 10.0
        assert g.forward(3) == 32.0
        CFG["shift"][1] = 5.0  # a list inside the dict
        assert g.forward(3) == 36.0
        CFG["tags"].add("b")  # a set inside it
        assert g.forward(3) == 37.0
    finally:
        CFG.clear()
        CFG.update(saved)
    assert g.forward(3) == 8.0  # as it was: the first entry's key again


def test_a_global_container_holding_other_objects_is_read_once():
    from somatize import bindings

    copied, exact = bindings._content([1, "a", (2.5, None), {"k": b"v"}])
    assert copied == [1, "a", (2.5, None), {"k": b"v"}] and exact is not None
    big = list(range(bindings.EXACT_LIMIT + 1))  # compared by == alone
    assert bindings._content(big) == (big, None)
    assert bindings._content([object()]) is bindings._MISSING  # (rebind it to change it)
    assert bindings._content(list(range(bindings.CONTENT_LIMIT + 1))) is bindings._MISSING
    assert bindings._content((1, 2)) is bindings._MISSING  # immutable: nothing to compare


CALLS = {"n": 0}
SEEN: list = []


class Counted(Node):
    def forward(self, x, ctx):
        CALLS["n"] += 1  # the node's own records: a counter and a log
        SEEN.append(x)
        return Done(x * CFG["scale"])


def test_a_global_the_nodes_own_code_changes_in_place_is_its_record_not_its_data():
    # a counter or a log the node keeps changed its key at every call, so it never hit
    # (our own Lightning tests count calls so); settings it only reads are still compared
    me = sys.modules[__name__]
    g = Graph(keeper=MemoryKeeper()).node("c", Counted()).cache("c")
    before = CALLS["n"]
    assert [g.forward(3) for _ in range(3)] == [6.0] * 3
    assert CALLS["n"] == before + 1  # computed once, then hit
    other = Graph(keeper=g.keeper).node("c", Counted()).cache("c")
    assert other.forward(3) == 6.0 and CALLS["n"] == before + 1  # same key in a new graph
    from somatize.changes import global_parts

    said = {k.split(" ")[0]: v for k, v in global_parts(Counted).items()}
    assert said["CALLS"] == "record:dict" and said["SEEN"] == "record:list"  # (explain too)
    try:
        CFG["scale"] = 5.0
        assert g.forward(3) == 15.0 and CALLS["n"] == before + 2
    finally:
        CFG["scale"] = 2.0
        me.SEEN.clear()


def test_what_code_changes_in_place_is_read_from_its_source():
    import ast

    from somatize.source_code import written

    tree = ast.parse(
        "def f(x):\n"
        "    CALLS['n'] += 1\n"
        "    LOG['a']['b'] = x\n"
        "    stats.SEEN.add(x)\n"
        "    del CACHE[x]\n"
        "    self.seen.append(x)\n"
        "    y = TABLE[x]\n"
        "    return CFG.get('k')\n"
    )
    assert written(tree) == {"CALLS", "LOG", "stats.SEEN", "CACHE", "self.seen"}


EXACT = {"k": 2, "flags": [0.0]}


class Exact(Node):
    def forward(self, x, ctx):
        return Done((x * EXACT["k"], EXACT["flags"][0]))


def test_a_value_of_a_global_container_changed_in_type_alone_is_seen():
    """``==`` holds ``2 == 2.0 == True`` and ``0.0 == -0.0``: an int made a float in a
    config (2 -> 2.0: an int tensor times it is a float tensor) kept serving the int."""
    g = Graph(keeper=MemoryKeeper()).node("e", Exact()).cache("e")
    try:
        for k, flag in [(2, 0.0), (2.0, 0.0), (True, 0.0), (1, 0.0), (1, -0.0), (2, 0.0)]:
            EXACT["k"], EXACT["flags"][0] = k, flag
            out = g.forward(3)
            assert out == (3 * k, flag)
            assert [type(v) for v in out] == [type(3 * k), float]
            assert str(out[1]) == str(flag)  # (-0.0 prints as such)
    finally:
        EXACT["k"], EXACT["flags"][0] = 2, 0.0


class Looks(Node):
    def forward(self, x, ctx):
        return Done(x + len(EXACT["flags"]))


def test_a_global_container_given_a_value_eq_cannot_compare_is_a_change_not_a_crash():
    """A tensor put into a watched container: its ``==`` cannot be made a bool, and the key
    raised "Boolean value of Tensor ... is ambiguous"; it is a change, read anew."""
    torch = pytest.importorskip("torch")
    import somatize.torch as st

    g = Graph(keeper=MemoryKeeper()).node("l", Looks()).cache("l")
    st.module(g)
    assert g.forward(1) == 2
    try:
        EXACT["flags"][0] = torch.ones(3)
        assert g.forward(1) == 2  # (read anew: the same length, the same value)
    finally:
        EXACT["flags"][:] = [0.0]


class Settings:
    def __init__(self) -> None:
        self.scale = 2
        self.inner = Shift()


class Shift:
    def __init__(self) -> None:
        self.by = 0


SETTINGS = Settings()


class Scaled(Node):
    SCALE = 1  # a class constant: set anew below

    def forward(self, x, ctx):
        return Done(x * SETTINGS.scale * self.SCALE + SETTINGS.inner.by)


def test_a_global_object_of_the_users_changed_in_place_and_a_class_constant_are_seen():
    """Found by an outside audit: ``SETTINGS.scale = 5`` (a module-level config object of
    the user's) and ``Scaled.SCALE = 5`` kept serving the entries computed before."""
    g = Graph(keeper=MemoryKeeper()).node("s", Scaled()).cache("s")
    assert g.forward(3) == 6
    try:
        SETTINGS.scale = 5
        assert g.forward(3) == 15
        SETTINGS.inner.by = 1  # an object it holds
        assert g.forward(3) == 16
        SETTINGS.scale = 5.0  # in type alone
        assert g.forward(3) == 16.0 and type(g.forward(3)) is float
        Scaled.SCALE = 10
        assert g.forward(3) == 151.0
    finally:
        SETTINGS.scale, SETTINGS.inner.by, Scaled.SCALE = 2, 0, 1
    assert g.forward(3) == 6


class Tally:
    def __init__(self) -> None:
        self.calls = 0
        self.seen: list = []


TALLY = Tally()


class Tallied(Node):
    def forward(self, x, ctx):
        TALLY.calls += 1  # an object of the user's the code keeps its records in
        TALLY.seen.append(x)
        return Done(x * 2)


def test_a_global_object_the_nodes_code_sets_is_its_record_not_its_data():
    keeper = MemoryKeeper()
    g = Graph(keeper=keeper).node("t", Tallied()).cache("t")
    assert [g.forward(3) for _ in range(3)] == [6, 6, 6]
    assert TALLY.calls == 1 and keeper.stats().entries == 1  # computed once, then hit


class ClassCounted(Node):
    calls = 0  # class attributes the code counts in: records, not data
    rows = 0
    FACTOR = 3  # one it only reads: data

    def forward(self, x, ctx):
        type(self).calls += 1
        ClassCounted.rows += 1
        return Done(x * self.FACTOR)


def test_a_class_attribute_the_nodes_code_sets_is_its_record_not_its_data():
    keeper = MemoryKeeper()
    g = Graph(keeper=keeper).node("c", ClassCounted()).cache("c")
    assert [g.forward(2) for _ in range(3)] == [6, 6, 6]
    assert ClassCounted.calls == ClassCounted.rows == 1 and keeper.stats().entries == 1
    ClassCounted.FACTOR = 4
    try:
        assert g.forward(2) == 8
    finally:
        ClassCounted.FACTOR = 3
