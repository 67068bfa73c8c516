"""A Lightning argument or method written against somatize's Trainer gets Python's error
with a note naming what to write here (docs/trainer.md, "Coming from Lightning")."""

from __future__ import annotations

import gc
import re
import sys

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import JsonLines
from somatize.errors import SettingError
from somatize.torch.ported import ATTRIBUTES, LIGHTNING, METHODS

from .trainer_helpers import batches, make_graph


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


def notes(e: pytest.ExceptionInfo[BaseException]) -> str:
    return "\n".join(getattr(e.value, "__notes__", []))


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda: st.Trainer(optimizer=sgd, max_epochs=3),
            r"max_epochs is Lightning's; here: Trainer\(epochs",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, gradient_clip_val=1.0),
            r"options=st.Options\(clip_grad_norm",
        ),
        (  # before: "options=torchrun for several processes"
            lambda: st.Trainer(optimizer=sgd, devices=2),
            r"here: torchrun for several processes; Options\(device=\.\.\.\) for one$",
        ),
        (lambda: st.Trainer(optimizer=sgd, log_every_n_steps=5), r"st.TensorBoard\(dir, every"),
        (lambda: st.Options(log_every_n_steps=5), r"here: watchers=\[st.TensorBoard"),
        (
            lambda: st.Options(gradient_clip_algorithm="value"),
            r"here: Options\(clip_grad_value=v\) for \"value\" \(clip_grad_norm=v for \"norm",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, gradient_clip_algorithm="value"),
            r"here: options=st.Options\(clip_grad_value=v\) .*v being gradient_clip_val$",
        ),
        (lambda: st.Trainer(optimizer=sgd, callbacks=[]), r"pruner=st.Patience"),
        (lambda: st.Options(accumulate_grad_batches=2), r"here: Options\(accumulate=\.\.\.\)"),
        (lambda: st.Checkpointing("ck", save_top_k=2), r"here: Checkpointing\(best=K\)"),
        (lambda: st.Checkpointing("ck", monitor="val_acc"), r"here: Options\(monitor="),
        # before: Python's TypeError alone (EarlyStopping's, CSVLogger's, TensorBoardLogger's
        # keywords; Lightning switches that are off here already)
        (
            lambda: st.Patience(monitor="val_loss", patience=3),
            r"monitor is Lightning's; here: Patience\(metric\), the first argument: "
            r"st.Patience\('val_loss', patience=3\)$",
        ),
        (lambda: st.Patience(verbose=True), r"here: nothing: .*result.pruned_reason$"),
        (
            lambda: st.Patience(stopping_threshold=0.1),
            r"here: a pruner of its own, st.Threshold\(metric, lower=v\)",
        ),
        (
            lambda: st.CSVLog("log.csv", log_every_n_steps=5),
            r"^log_every_n_steps is Lightning's; here: CSVLog\(path, every_steps=N\)$",
        ),
        (
            lambda: st.TensorBoard("tb", log_every_n_steps=5),
            r"^log_every_n_steps is Lightning's; here: TensorBoard\(log_dir, every_steps=N\)$",
        ),
        (
            lambda: st.TensorBoard(save_dir="runs", name="exp"),
            r"^save_dir is Lightning's; here: TensorBoard\(log_dir\): the run's own directory",
        ),
        (
            lambda: st.Options(enable_checkpointing=False),
            r"here: nothing: no checkpoint is written unless checkpoint=st.Checkpointing",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, enable_model_summary=False),
            r"here: nothing: fit prints no summary; print\(st.model_summary\(g\)\)",
        ),
        (lambda: st.Options(log_every_n_steps=5), r"st.CSVLog\(path, every_steps=N\)"),
    ],
)
def test_a_lightning_keyword_gets_the_somatize_spelling(make, said):
    with pytest.raises(TypeError, match="unexpected keyword argument") as e:
        make()
    assert re.search(said, notes(e)), notes(e)


def test_fit_and_the_lightning_methods_say_what_to_call():
    t = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=st.Options(progress=False))
    with pytest.raises(TypeError) as e:
        t.fit(make_graph(), batches(2), ckpt_path="last")
    assert 'resume="last"' in notes(e)
    for name, fix in METHODS.items():
        with pytest.raises(AttributeError, match=rf"'{name}' is Lightning's.*{fix.split('(')[0]}"):
            getattr(t, name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'$"):
        t.nothing  # noqa: B018 -- anything else: Python's own error, unchanged
    assert "__getattr__" not in vars(st.Trainer)  # (it would slow every attribute read)


def test_a_keyword_that_is_ours_is_not_explained_and_every_row_names_an_owner():
    with pytest.raises(TypeError) as e:
        st.Trainer(optimizer=sgd, epochz=3)
    assert notes(e) == "did you mean 'epochs'?"  # (a misspelling: no Lightning note)
    assert set(LIGHTNING) == {
        "Trainer",
        "Options",
        "Checkpointing",
        "Patience",
        "CSVLog",
        "TensorBoard",
        "fit",
        "evaluate",
        "predict",
    }


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: st.Trainer(optimizer=sgd, epoch=3), "did you mean 'epochs'?"),
        (lambda: st.Options(devic="cpu"), "did you mean 'device'?"),
        (lambda: st.Options(acumulate=2), "did you mean 'accumulate'?"),
        (lambda: st.Checkpointing("ck", every_step=2), "did you mean 'every_steps'?"),
        (lambda: st.CSVLog("log.csv", every_step=2), "did you mean 'every_steps'?"),
        (lambda: st.Patience("val_loss", patiance=2), "did you mean 'patience'?"),
    ],
)
def test_a_misspelt_keyword_gets_the_closest_ones(make, said):
    with pytest.raises(TypeError, match="unexpected keyword argument") as e:
        make()
    assert said in notes(e), notes(e)


def test_a_misspelt_fit_keyword_gets_the_closest_and_a_far_one_nothing():
    t = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=st.Options(progress=False))
    with pytest.raises(TypeError) as e:
        t.fit(make_graph(), batches(2), resum="last")
    assert "did you mean 'resume'?" in notes(e)
    with pytest.raises(TypeError) as e:
        st.Trainer(optimizer=sgd, zzzzzz=1)
    assert notes(e) == ""


def test_lightning_attributes_of_a_trainer_say_what_to_read():
    # before: "'Trainer' object has no attribute 'estimated_stepping_batches'", no fix named
    t = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=st.Options(progress=False))
    said = {
        "estimated_stepping_batches": r"trainer.planned_steps\(train\)",
        "global_step": r"result.steps",
        "current_epoch": r"result.epochs",
    }
    assert set(said) == set(ATTRIBUTES)
    for name, fix in said.items():
        with pytest.raises(
            AttributeError, match=rf"^'{name}' is Lightning's Trainer attribute; here: {fix}"
        ):
            getattr(t, name)
        assert not hasattr(st.Trainer, name)
    assert t.planned_steps(batches(3)) == 3  # the method the note names


@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_evaluate_and_predict_say_how_to_load_a_checkpoint_for_ckpt_path(call):
    # before: a TypeError without a note; Lightning's test(ckpt_path="best") has no keyword here
    t = st.Trainer(loss=F.cross_entropy, options=st.Options(progress=False))
    with pytest.raises(TypeError, match="unexpected keyword argument 'ckpt_path'") as e:
        getattr(t, call)(make_graph(), batches(2), ckpt_path="best")
    assert re.search(
        rf"ckpt_path is Lightning's; here: .*st.load_state\(g, st.load_checkpoint\("
        rf"result.best_checkpoint\)\).*then trainer.{call}\(g, data\)$",
        notes(e),
    ), notes(e)
    with pytest.raises(TypeError) as e:
        getattr(t, call)(make_graph(), dataloaders=batches(2))
    assert (
        notes(e)
        == f"dataloaders is Lightning's; here: trainer.{call}(g, loader) (the second argument)"
    )
    assert len(getattr(t, call)(make_graph(), batches(2))) >= 1  # the call itself is unchanged


@pytest.mark.parametrize(
    "make",
    [
        lambda path: st.CSVLog(path / "log.csv", log_every_n_steps=5),
        lambda path: JsonLines(path / "run.jsonl", flush=True),
    ],
)
def test_a_log_refused_a_keyword_is_collected_without_an_error_of_its_own(
    make, tmp_path, monkeypatch
):
    # before: its __del__ read self._fd, which the __init__ that never ran had not set:
    # "Exception ignored in: <function CSVLog.__del__ ...> AttributeError: ... '_fd'"
    said = []
    monkeypatch.setattr(sys, "unraisablehook", said.append)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        make(tmp_path)
    gc.collect()
    assert [str(u.exc_value) for u in said] == []


def test_lightning_callbacks_given_as_a_pruner_or_watchers_name_the_settings_here():
    # before: "a EarlyStopping has not; e.g. st.Patience('val_loss', patience=3)" whatever it
    # watched, and "ModelCheckpoint ... is not a watcher" with no word of Checkpointing
    callbacks = pytest.importorskip("lightning.pytorch.callbacks")
    stop = callbacks.EarlyStopping(monitor="val_acc", mode="max", patience=5, min_delta=0.01)
    with pytest.raises(SettingError) as e:
        st.Trainer(optimizer=sgd, pruner=stop)
    assert str(e.value).endswith(
        "and an EarlyStopping has not; EarlyStopping is a Lightning callback; here: "
        "pruner=st.Patience('val_acc', patience=5, mode='max', min_delta=0.01)"
    )
    st.Patience("val_acc", patience=5, mode="max", min_delta=0.01)  # what it says is valid
    keep = callbacks.ModelCheckpoint(dirpath="ck", monitor="val_loss", save_top_k=2)
    said = {
        keep: rf"here: checkpoint=st.Checkpointing\('{re.escape(str(keep.dirpath))}', best=2\) "
        r"with options=st.Options\(monitor='val_loss', mode='min'\)$",
        callbacks.EarlyStopping("val_loss"): r"here: pruner=st.Patience\('val_loss', patience=3",
        callbacks.LearningRateMonitor(): r"here: nothing: st.TensorBoard\(dir\) and st.CSVLog",
        callbacks.BackboneFinetuning(): r"a Lightning callback, which runs under lightning.Trainer",
    }
    for callback, fix in said.items():
        with pytest.raises(SettingError, match=r"is not a watcher: .*on_event\(event\); ") as e:
            st.Trainer(optimizer=sgd, watchers=[callback])
        assert re.search(fix, str(e.value)), str(e.value)
    with pytest.raises(SettingError) as e:  # not Lightning's: as before
        st.Trainer(optimizer=sgd, pruner=object(), watchers=[])
    assert str(e.value).endswith("an object has not; e.g. st.Patience('val_loss', patience=3)")


def test_a_lightning_module_given_to_fit_warns_that_its_training_step_is_not_called():
    # before: fit trained it through forward and loss= without a word, its training_step's
    # own loss (label smoothing, a penalty) and configure_optimizers left out of the run
    L = pytest.importorskip("lightning")

    class Lit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, i):
            return F.cross_entropy(self(batch[0]), batch[1], label_smoothing=0.1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Forward(L.LightningModule):  # no hook of its own: forward is all it is
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.net(x)

    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    t = st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=st.Options(progress=False))
    lit = Lit()
    with pytest.warns(UserWarning) as said:
        t.fit(lit, data)
    (w,) = said
    assert w.filename == __file__  # (the line that called fit)
    assert str(w.message).startswith(
        "fit() got test_a_lightning_module_given_to_fit_warns_that_its_training_step_is_not_"
        "called.<locals>.Lit, a LightningModule: the somatize Trainer calls its forward, "
        "model(x), and the Trainer's loss= on the output, never its training_step or "
        "configure_optimizers"
    )
    assert "fit(lit.net, ...)" in str(w.message)
    t.fit(lit.net, data)  # the network it holds: as it says, no warning
    t.fit(Forward(), data)
