"""A node's exception comes back from a process pool as itself — also one whose class came by
value with the node's code — or, where it cannot cross, as a RuntimeError naming it; the
pool is never broken by it, and the error is never taken for a lost worker."""

import concurrent.futures as cf
import multiprocessing

import pytest

from somatize import Done, Graph, Node
from somatize.errors import TransportError
from somatize.transports import ExecutorTransport


class Diverged(Exception):
    """The user's own exception: its class is shipped by value with the node's code."""


class TwoArgs(Exception):
    def __init__(self, what, step):  # super() gets one argument: it unpickles nowhere
        super().__init__(f"{what} at step {step}")


class Inc(Node):
    def forward(self, x, ctx):
        return Done(x + 1)


class Raises(Node):
    def __init__(self, kind: str):
        self.kind = kind

    def forward(self, x, ctx):
        if self.kind == "own":
            raise Diverged(f"loss diverged on {x}")
        raise TwoArgs("nan", x)


@pytest.fixture(scope="module")
def pool():
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as p:
        yield p


def far(kind: str) -> Graph:
    return Graph.somatize(Inc() >> Raises(kind).with_id("far")).place("far", host="box")


def still_works(pool: cf.Executor) -> None:
    g = Graph.somatize(Inc().with_id("far")).place("far", host="box")
    assert g.forward(1, transports={"box": ExecutorTransport(pool)}) == 2


@pytest.mark.slow
def test_the_users_own_exception_class_arrives_as_itself(pool):
    # before: a TransportError saying the worker was lost (plain pickle refused the class
    # the worker had by value: "not the same object as test_transports_errors.Diverged")
    with pytest.raises(Diverged, match="loss diverged on 2") as raised:
        far("own").forward(1, transports={"box": ExecutorTransport(pool, retries=2)})
    assert type(raised.value) is Diverged  # this module's class: `except Diverged` catches it
    assert "raised by node 'far' (Raises) on host 'box'" in raised.value.__notes__
    still_works(pool)


@pytest.mark.slow
def test_an_exception_that_unpickles_nowhere_is_a_runtime_error_naming_it(pool):
    with pytest.raises(RuntimeError) as raised:
        far("two").forward(1, transports={"box": ExecutorTransport(pool, retries=2)})
    message = str(raised.value)
    assert not isinstance(raised.value, TransportError)  # not a lost worker, not retried
    assert "slice 2 on host 'box' (far) raised TwoArgs: nan at step 2" in message
    assert "pass super().__init__() every argument __init__ takes" in message
    notes = "\n".join(raised.value.__notes__)
    assert "the original traceback, in the worker" in notes and "in forward" in notes
    still_works(pool)
