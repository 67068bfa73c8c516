"""The Trainer's errors say what is wrong and what to do: losses and metrics that are not
scalars, nothing to train, bad arguments and options, missing data."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize.errors import CheckpointError
from tests.torch.trainer_helpers import batches, make_graph, quiet, sgd

# -- errors say what is wrong and what to do --------------------------------------------


def test_a_loss_that_is_not_a_scalar_is_refused():
    trainer = st.Trainer(
        loss=lambda out, y: F.cross_entropy(out, y, reduction="none"),
        optimizer=sgd,
        options=quiet(),
    )
    with pytest.raises(TypeError, match=r"scalar.*shape \(10,\).*mean"):
        trainer.fit(make_graph(), batches(1))


def test_an_all_frozen_graph_has_nothing_to_train():
    g = make_graph()
    for node in g.nodes():
        g.freeze(node)
    with pytest.raises(ValueError, match=r"nothing to train.*freeze"):
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet()).fit(g, batches(1))


def test_resume_last_needs_checkpointing():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=quiet())
    with pytest.raises(CheckpointError, match=r"resume='last' needs checkpoint=Checkpointing"):
        trainer.fit(make_graph(), batches(1), resume="last")


def test_metric_that_is_not_a_scalar_is_refused():
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, metrics={"bad": lambda o, y: o}, options=quiet()
    )
    with pytest.raises(TypeError, match=r"'bad' must give one number.*\(10, 3\)"):
        trainer.fit(make_graph(), batches(1), val=batches(1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"optimizer": torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1)},
            TypeError,
            "factory",
        ),
        ({"optimizer": sgd, "micro_batches": 0}, ValueError, "micro_batches"),
        ({"optimizer": sgd, "epochs": 0}, ValueError, "epochs"),
        ({"optimizer": sgd, "pruner": object()}, TypeError, "should_prune"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        st.Trainer(**kwargs)


def test_bad_options_are_refused():
    with pytest.raises(
        ValueError, match="precision must be one of '32', 'bf16', 'fp16', not '16-mixed'"
    ):
        st.Options(precision="16-mixed")
    with pytest.raises(ValueError, match="scheduler_every"):
        st.Options(scheduler_every="batch")


def test_empty_training_data_is_an_error():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, max_steps=5, options=quiet())
    with pytest.raises(ValueError, match="no batches"):
        trainer.fit(make_graph(), [])


def test_a_pruner_without_validation_data_is_an_error():
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, pruner=st.Patience(), options=quiet())
    with pytest.raises(ValueError, match="val="):
        trainer.fit(make_graph(), batches(1))


def test_a_fit_that_raised_leaves_its_model_to_reference_counting():
    # fit's frame held its own exception (exception -> traceback -> frame -> exception):
    # the failed run (its model, optimizer and, under DDP, the wrapper's hooks on the
    # parameters) stayed until some later collection, at any point of the next fit
    def failing(out, y):
        raise RuntimeError("this loss fails")

    trainer = st.Trainer(loss=failing, optimizer=sgd, options=quiet())
    g = make_graph()
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(RuntimeError, match="this loss fails"):
            trainer.fit(g, batches(2))
        weight = weakref.ref(next(iter(st.parameters(g))))
        del g
        assert weight() is None
    finally:
        gc.enable()
