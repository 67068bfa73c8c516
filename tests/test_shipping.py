"""Shipping a slice's code (``somatize/shipping.py``): the bytes load back as the nodes,
and a worker running another version of what the caller's keys name refuses them."""

import uuid

import pytest
from blake3 import blake3

import somatize.shipping
from somatize import Done, Graph, Node
from somatize.errors import TransportError
from somatize.shipping import keyed_versions, load_code, pack_code
from somatize.transports import ExecutorTransport


class Tag(Node):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def forward(self, x, ctx):
        return Done([x, self.tag])


def _packed() -> tuple[str, bytes, str]:
    tag = uuid.uuid4().hex  # new bytes: not in this process's cache of loaded code
    code = pack_code({"tag": Tag(tag)}, (), "slice 1")
    return blake3(code).hexdigest(), code, tag


def test_code_loads_back_as_the_nodes_it_was_packed_from():
    digest, code, tag = _packed()
    bundle = load_code(digest, code, "slice 1")
    assert bundle is not None and bundle.impls["tag"].tag == tag
    assert load_code(digest, None, "slice 1") is bundle  # kept by digest


def test_the_versions_a_key_names_are_shipped_and_checked(monkeypatch):
    assert keyed_versions()["somatize"] == somatize.shipping._installed("somatize")
    digest, code, _ = _packed()
    here = somatize.shipping._installed
    monkeypatch.setattr(
        somatize.shipping,
        "_installed",
        lambda dist: "0.0.1" if dist == "somatize" else here(dist),  # the worker's
    )
    with pytest.raises(TransportError) as e:
        load_code(digest, code, "slice 1 on host 'box' (tag)")
    said = str(e.value)
    assert "slice 1 on host 'box' (tag)" in said
    assert f"somatize {here('somatize')} there, 0.0.1 here" in said
    assert f"pip install somatize=={here('somatize')}" in said
    assert load_code(digest, None, "slice 1") is None  # refused code is not kept


def test_a_version_refusal_comes_back_from_the_worker_unretried(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    here = somatize.shipping._installed
    monkeypatch.setattr(
        somatize.shipping, "_installed", lambda d: "0.0.1" if d == "somatize" else here(d)
    )
    monkeypatch.setattr(somatize.shipping, "keyed_versions", lambda: {"somatize": here("somatize")})
    g = Graph.somatize(Tag(uuid.uuid4().hex)).place("tag", host="box")
    with ThreadPoolExecutor(1) as pool:  # (a worker in this process: the patch reaches it)
        t = ExecutorTransport(pool, retries=3)
        with pytest.raises(TransportError, match=r"0\.0\.1 here"):
            g.forward(1, transports={"box": t})
    assert t.shipped == 1  # refused once, not retried


def test_a_worker_running_an_uninstalled_source_tree_is_not_refused(monkeypatch):
    digest, code, tag = _packed()
    monkeypatch.setattr(somatize.shipping, "_installed", lambda dist: "not installed")
    bundle = load_code(digest, code, "slice 1")
    assert bundle is not None and bundle.impls["tag"].tag == tag


SCALE = 3


class Scaled(Node):
    def forward(self, x, ctx):
        return Done(x * SCALE)


def test_running_a_node_in_this_process_leaves_its_own_class_as_it_was(monkeypatch):
    # cloudpickle, unpickling a class it pickled by value in the same process, sets the
    # class's attributes anew: its methods became copies reading a snapshot of the globals
    from somatize.transports import InProcess

    forward = Scaled.forward
    g = Graph.somatize(Scaled()).place("scaled", host="box")
    assert g.forward(2, transports={"box": InProcess()}) == 6
    assert Scaled.forward is forward
    monkeypatch.setattr(__import__(__name__, fromlist=["_"]), "SCALE", 7)
    assert Scaled().forward(2, None).value == 14  # the module's global, as rebound
    assert g.forward(2, transports={"box": InProcess()}) == 14


class Fussy(Node):
    """Holds something that will not be rebuilt elsewhere (a handle, a session)."""

    def __setstate__(self, state):
        raise RuntimeError("this handle works only in the process that made it")

    def forward(self, x, ctx):
        return Done(x)


def test_a_node_that_refuses_to_be_rebuilt_is_not_blamed_on_a_missing_package():
    code = pack_code({"fussy": Fussy()}, (), "slice 1")
    with pytest.raises(TransportError) as e:
        load_code(blake3(code).hexdigest(), code, "slice 1 on host 'box' (fussy)")
    said = str(e.value)
    assert "(fussy)" in said and "only in the process that made it" in said
    assert "__setstate__" in said and "install that package" not in said


def test_code_naming_a_module_the_worker_lacks_says_to_install_it():
    code = pack_code({"tag": Tag("x")}, (), "slice 1")
    code = code.replace(b"somatize.node", b"somatize.nodX")  # (a module missing here)
    with pytest.raises(TransportError, match="install that package"):
        load_code(blake3(code).hexdigest(), code, "slice 1")
