"""The Trainer's settings checks (settings.py, options.py): each mistake a SettingError
(or a warning, where the setting could be meant) naming the value and the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError
from tests.torch.test_trainer_bad_input import Linear, sgd

torch.set_num_threads(1)


def data(n=2):
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(n)
    ]


def quiet(**kw):
    return st.Options(progress=False, sanity_val_batches=0, **kw)


# -- the scheduler (S1, S2/F2, C12) ----------------------------------------------------


def test_a_scheduler_factory_returning_the_optimizer_is_refused():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, scheduler=lambda opt: opt)
    with pytest.raises(SettingError, match=r"returned the optimizer \(SGD\).*step it twice"):
        trainer.fit(Graph.somatize(Linear()), data())


def plateau(mode):
    return lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode=mode, patience=0)


@pytest.mark.parametrize(
    ("sched_mode", "monitor", "mode"), [("min", "val_acc", "max"), ("max", "val_loss", "min")]
)
def test_a_plateau_scheduler_improving_the_other_way_than_the_monitor_is_refused(
    sched_mode, monitor, mode
):
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        scheduler=plateau(sched_mode),
        metrics={"acc": st.accuracy},
        options=quiet(monitor=monitor, mode=mode),
    )
    g = Graph.somatize(Linear())
    before = g["linear"].lin.weight.detach().clone()
    with pytest.raises(
        SettingError, match=rf"ReduceLROnPlateau\(mode='{sched_mode}'\).*mode='{mode}'"
    ):
        trainer.fit(g, data(), val=data(1))
    assert torch.equal(g["linear"].lin.weight, before)  # refused before any step


def test_a_plateau_scheduler_agreeing_with_the_monitor_trains():
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        scheduler=plateau("max"),
        epochs=2,
        metrics={"acc": st.accuracy},
        options=quiet(monitor="val_acc", mode="max"),
    )
    assert trainer.fit(Graph.somatize(Linear()), data(), val=data(1)).steps == 4


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"optimizer": lambda: torch.optim.SGD([], lr=0.1)},
            r"optimizer is called with one argument \(params\).*lambda params:",
        ),
        (
            {"optimizer": sgd, "scheduler": torch.optim.lr_scheduler.StepLR},
            r"scheduler is called with one argument \(opt\), and the class StepLR cannot be.*"
            r"step_size.*lambda opt:",
        ),
    ],
)
def test_a_factory_that_cannot_take_one_argument_is_refused_when_the_trainer_is_made(kw, match):
    with pytest.raises(SettingError, match=match):
        st.Trainer(loss=F.cross_entropy, **kw)


def test_an_optimizer_class_taking_the_parameters_alone_is_a_factory():
    result = st.Trainer(loss=F.cross_entropy, optimizer=torch.optim.Adam).fit(
        Graph.somatize(Linear()), data()
    )
    assert result.steps == 2


# -- a module shared by a frozen and a trainable node (S5) ------------------------------


class Uses(Node):
    def __init__(self, m: nn.Module) -> None:
        self.m = m

    def forward(self, x, ctx):
        return Done(Opaque(self.m(x)))


def test_a_module_held_by_a_frozen_and_a_trainable_node_is_refused_naming_both():
    from somatize.errors import StateError

    shared = nn.Linear(3, 3)
    g = Graph.somatize(Uses(shared).with_id("backbone") >> Uses(shared).with_id("adapter"))
    g.freeze("backbone")
    with pytest.raises(
        StateError,
        match=r"node 'backbone' is frozen and node 'adapter' is not.*"
        r"copy.deepcopy",
    ):
        st.module(g)
    g.freeze("adapter")  # both frozen: consistent
    assert st.parameters(g) == []


def test_a_module_shared_by_two_trainable_nodes_stays_tied():
    shared = nn.Linear(3, 3)
    g = Graph.somatize(Uses(shared).with_id("a") >> Uses(shared).with_id("b"))
    assert len(st.parameters(g)) == 2


# -- Options' types and names (S3, S9, C3) ----------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"shuffle": "no"}, r"shuffle must be True or False, not 'no' \(any non-empty string"),
        ({"shuffle": 0}, r"shuffle must be True or False, not 0; pass shuffle=True or"),
        ({"progress": "yes"}, r"progress must be True or False \(or None.*not 'yes'"),
        ({"monitor": 5}, r"monitor must name an evaluated metric \(a string\), not 5"),
        ({"monitor": ""}, r"monitor must name an evaluated metric"),
        ({"compile": {"bogus": 1}}, r"compile=...\) has 'bogus', which torch.compile does not"),
        ({"compile": "max"}, r"not 'max'; e\.g\. Options\(compile=True\)"),
        ({"device": "meta"}, r"device 'meta' holds no data.*pass 'cpu'"),
    ],
)
def test_options_of_the_wrong_type_are_refused_when_made(kw, match):
    with pytest.raises(SettingError, match=match):
        st.Options(**kw)


def test_options_of_the_right_type_are_kept():
    o = st.Options(shuffle=False, progress=None, compile={"mode": "max-autotune"})
    assert (o.shuffle, o.progress, dict(o.compile)) == (False, None, {"mode": "max-autotune"})


@pytest.mark.parametrize(
    ("monitor", "mode", "way"),
    [("val_acc", "min", "max"), ("val_clean_f1", "min", "max"), ("val_loss", "max", "min")],
)
def test_a_monitor_whose_name_says_the_other_way_than_mode_is_warned_about(monitor, mode, way):
    with pytest.warns(UserWarning, match=rf"monitor='{monitor}', mode='{mode}'.*mode='{way}'"):
        st.Options(monitor=monitor, mode=mode)


def test_best_keeps_the_best_accuracy_when_the_mode_agrees():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        options = quiet(monitor="val_acc", mode="max")
        st.Options(monitor="val_nll")  # names that say nothing are not guessed at
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        epochs=3,
        metrics={"acc": st.accuracy},
        options=options,
    )
    result = trainer.fit(Graph.somatize(Linear()), data(), val=data(1))
    assert result.best == max(m["val_acc"] for m in result.metrics)


# -- the factory check read off a function's code (settings._takes_one) ------------------


def _wrapped(ps):
    return ps


_wrapped.__wrapped__ = lambda: None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "fn",
    [
        lambda ps: ps,
        lambda ps, lr=0.1: ps,
        lambda *ps: ps,
        lambda ps, *, lr=0.1: ps,
        lambda ps, /: ps,
        lambda: None,
        lambda ps, lr: ps,
        lambda ps, *, lr: ps,
        lambda *, ps: ps,
        lambda ps=None, lr=None: ps,
        lambda **kw: kw,
        _wrapped,
    ],
)
def test_a_factorys_one_argument_is_read_off_its_code_as_its_signature_says(fn):
    import inspect

    from somatize.torch.settings import _takes_one

    try:
        inspect.signature(fn).bind(object())
        binds = True
    except TypeError:
        binds = False
    # never says yes where the signature says no; unsure (a __wrapped__) asks the signature
    assert _takes_one(fn) == (binds and fn is not _wrapped)
