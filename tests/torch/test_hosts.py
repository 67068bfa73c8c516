"""``somatize/hosts.py`` with torch: a frozen node placed on another host runs there as it
runs here (modules in eval mode, ``ctx.training`` False) and is keyed as a single-process
run keys it, the first distributed run too; a placed graph given to ``st.module`` or the
Trainer says how to train it."""

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque, Recorder
from somatize.errors import TransportError, ValueConversionError
from somatize.transports import InProcess
from somatize.watchers import CacheRows


class Enc(Node):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 4), nn.Dropout(0.5))

    def forward(self, x, ctx):
        return Done({"h": self.net(x).detach(), "training": ctx.training})


class Head(Node):
    def __init__(self) -> None:
        torch.manual_seed(1)
        self.lin = nn.Linear(4, 2)

    def forward(self, out, ctx):
        return Done(Opaque((self.lin(out["h"]), out["training"])))


def _graph(place: bool, keeper: MemoryKeeper | None = None) -> Graph:
    g = Graph.somatize(Enc() >> Head(), keeper=keeper)
    st.module(g)  # (the torch codecs: tensors cross as data)
    g.freeze("enc")
    if place:
        g.place("enc", host="gpu")
    return g


def test_a_frozen_node_on_another_host_runs_in_eval_mode_as_here():
    x = torch.randn(5, 8)
    here = _graph(False)
    there = _graph(True)
    box = {"gpu": InProcess()}
    want, want_training = here.forward(x, training=True)
    for step in range(2):  # its dropout off, every time: not a fresh draw per run
        got, got_training = there.forward(x, training=True, step=step, transports=box)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got_training is want_training is False  # a frozen node sees ctx.training False


def test_a_frozen_remote_cached_node_keys_like_one_process_from_its_first_run():
    x = torch.randn(5, 8)
    local = _graph(False, MemoryKeeper()).cache("enc")
    local.forward(x)
    (key,) = local.keeper.keys()
    box_keeper = MemoryKeeper()
    g = _graph(True).cache("enc")
    g.forward(x, transports={"gpu": InProcess(box_keeper)})
    assert list(box_keeper.keys()) == [key]  # not a key of its modules in training mode
    g.forward(x, transports={"gpu": InProcess(box_keeper)})
    assert list(box_keeper.keys()) == [key]


def test_a_trainable_node_beside_a_remote_frozen_one_trains_by_hand():
    x, y = torch.randn(5, 8), torch.randint(0, 2, (5,))
    g = _graph(True)
    ref = _graph(False)
    opts = [torch.optim.SGD(st.parameters(h), lr=0.1) for h in (g, ref)]
    for step in range(3):
        for h, opt, box in ((g, opts[0], {"gpu": InProcess()}), (ref, opts[1], None)):
            out, _ = h.forward(x, training=True, step=step, transports=box)
            loss = nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    for a, b in zip(st.parameters(g), st.parameters(ref), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same head, the same encoder


def test_a_placed_graph_given_to_module_or_the_trainer_says_how_to_train_it():
    g = _graph(True)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    trainer = st.Trainer(
        loss=lambda out, t: nn.functional.cross_entropy(out[0], t),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        epochs=1,
    )
    for call in (lambda: st.module(g)(x), lambda: trainer.fit(g, [(x, y)])):
        with pytest.raises(TransportError) as e:
            call()
        for part in ("'enc'", "'gpu'", "g.place('enc', host='local')", "training=True"):
            assert part in str(e.value)
    with pytest.raises(TransportError) as e:  # given transports: only the missing host
        g.forward(x, transports={"other": InProcess()})
    assert "st.module" not in str(e.value)


class Trains(Node):  # a trainable node: its output requires grad
    def __init__(self) -> None:
        self.lin = nn.Linear(8, 4)

    def forward(self, x, ctx):
        return Done(self.lin(x))


def test_a_remote_output_that_requires_grad_says_opaque_cannot_leave():
    g = Graph.somatize(Trains() >> Head().with_id("head"))
    st.module(g)
    g.place("trains", host="gpu")
    with pytest.raises(ValueConversionError, match="requires grad") as e:
        g.forward(torch.randn(2, 8), training=True, transports={"gpu": InProcess()})
    note = e.value.__notes__[-1]
    assert "node 'trains' runs on host 'gpu'" in note and "freeze 'trains'" in note


class Rows(Node):  # frozen and cached per example: a CacheRows event per batch
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = nn.Linear(8, 4)

    def forward(self, x, ctx):
        return Done(self.net(x))


def test_a_remote_node_cached_per_example_tells_the_callers_watchers_as_here():
    xs = [torch.randn(3, 8) for _ in range(2)]
    seen = []
    for place in (False, True):
        rec = Recorder()
        g = Graph.somatize(Rows(), watchers=[rec])
        st.module(g)
        g.freeze("rows").cache("rows", per="example")
        if place:
            g.place("rows", host="gpu")
        box = {"gpu": InProcess()} if place else None
        for _ in range(2):  # the second pass: every row a hit
            for x in xs:
                g.forward(x, transports=box)
        seen.append(
            [
                (e.node, e.hits, e.misses, e.keys, e.layout)
                for e in rec.events
                if isinstance(e, CacheRows)
            ]
        )
    assert seen[1] == seen[0] and [r[1:3] for r in seen[0]] == [(0, 3), (0, 3), (3, 0), (3, 0)]


class Reads(Node):  # inside a subgraph: what it sees of the run
    def forward(self, out, ctx):
        return Done({**out, "inner_training": ctx.training})


def test_a_frozen_subgraph_on_another_host_runs_as_here():
    x = torch.randn(5, 8)
    seen = []
    for place in (False, True):
        g = Graph.somatize(Graph.somatize(Enc() >> Reads()).with_id("tower"))
        st.module(g)
        g.freeze("tower")
        if place:
            g.place("tower", host="gpu")
        box = {"gpu": InProcess()} if place else None
        seen.append([g.forward(x, training=True, transports=box) for _ in range(2)])
    for here, there in zip(*seen, strict=True):
        torch.testing.assert_close(there["h"], here["h"], rtol=0, atol=0)  # dropout off
        assert there["training"] is here["training"] is False
        assert there["inner_training"] is here["inner_training"] is False


class DiesOnce(Node):
    def __init__(self, mark: str) -> None:
        self.mark = mark

    def forward(self, x, ctx):
        import os
        import signal

        if not os.path.exists(self.mark):
            open(self.mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return Done(x + 1)


@pytest.mark.slow
def test_a_slice_whose_worker_dies_runs_again_on_st_executor(tmp_path):
    from somatize.transports import ExecutorTransport

    g = Graph.somatize(DiesOnce(str(tmp_path / "died"))).place("dies_once", host="box")
    with st.executor(workers=1) as pool:
        assert g.forward(1, transports={"box": ExecutorTransport(pool)}) == 2
        assert pool.restarts == 1
