"""Several validation sets: fit(val={"clean": a, "noisy": b}) logs val_<name>_<metric>."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.errors import SettingError
from somatize.watchers import Metrics
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer
from tests.torch.test_trainer_sanity import Counting
from tests.torch.trainer_helpers import batches, make_graph, quiet


def sets():
    return {"clean": batches(2, seed=7), "noisy": batches(3, size=5, seed=8)}


def still(ps):
    return torch.optim.SGD(ps, lr=0.0)  # the weights stay: evaluations are comparable


def test_each_set_is_evaluated_and_named_by_its_key():
    rec = Recorder()
    g = make_graph()
    t = st.Trainer(
        loss=F.cross_entropy,
        optimizer=still,
        epochs=2,
        metrics={"acc": st.accuracy},
        watchers=[rec],
        options=quiet(monitor="val_noisy_acc", mode="max"),
    )
    result = t.fit(g, batches(2), val=sets())
    clean, noisy = (t.evaluate(g, v) for v in sets().values())
    want = {
        "val_clean_loss": clean["loss"],
        "val_clean_acc": clean["acc"],
        "val_noisy_loss": noisy["loss"],
        "val_noisy_acc": noisy["acc"],
    }
    assert result.metrics == [{"step": 2, "epoch": 0, **want}, {"step": 4, "epoch": 1, **want}]
    assert [e.values for e in rec.of(Metrics) if e.node == ""] == [want, want]
    assert result.best == noisy["acc"] and result.metric("val_clean_loss") == clean["loss"]


def test_one_loader_keeps_its_names_and_a_dict_of_one_is_named():
    one = st.Trainer(loss=F.cross_entropy, optimizer=still, options=quiet())
    assert set(one.fit(make_graph(), batches(2), val=batches(1)).metrics[0]) == {
        "step",
        "epoch",
        "val_loss",
    }
    named = st.Trainer(loss=F.cross_entropy, optimizer=still, options=quiet(monitor="val_a_loss"))
    assert set(named.fit(make_graph(), batches(2), val={"a": batches(1)}).metrics[0]) == {
        "step",
        "epoch",
        "val_a_loss",
    }


def test_the_monitor_picks_the_best_checkpoint_and_drives_the_pruner_and_the_plateau(tmp_path):
    made = []

    def plateau(opt):
        made.append(torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, threshold=0.0))
        return made[-1]

    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        scheduler=plateau,
        epochs=4,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", keep=1, best=1),
        pruner=st.Patience("val_noisy_loss", patience=1),
        options=quiet(monitor="val_clean_loss"),
    ).fit(make_graph(), batches(4), val=sets())
    clean = [m["val_clean_loss"] for m in result.metrics]
    assert result.best == min(clean)
    best_step = result.metrics[clean.index(min(clean))]["step"]
    assert result.best_checkpoint.endswith(f"step-{best_step:09d}.ckpt")
    assert made[0].best == min(clean)  # stepped with the clean set's loss


def test_the_default_monitor_with_several_sets_is_the_first_sets_loss_for_best():
    # it was refused, though nothing but result.best read it: every user of several sets
    # had to name a monitor first
    t = st.Trainer(
        loss=F.cross_entropy, optimizer=still, metrics={"acc": st.accuracy}, options=quiet()
    )
    result = t.fit(make_graph(), batches(2), val=sets())
    assert result.monitor == "val_clean_loss"
    assert result.best == min(m["val_clean_loss"] for m in result.metrics)


@pytest.mark.parametrize(
    "acting",
    [
        {"checkpoint": "best"},
        {"pruner": "trial"},
        {"scheduler": lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt)},
    ],
    ids=["best-checkpoints", "optuna-trial", "plateau"],
)
def test_the_default_monitor_with_several_sets_is_refused_where_it_acts(tmp_path, acting):
    class Trial:  # (what a pruner without a metric of its own is: Optuna's trial)
        def report(self, value, step):
            pass

        def should_prune(self):
            return False

    settings = dict(acting)
    if settings.get("checkpoint") == "best":
        settings["checkpoint"] = st.Checkpointing(tmp_path, best=1)
    if settings.get("pruner") == "trial":
        settings["pruner"] = Trial()
    t = st.Trainer(
        loss=F.cross_entropy, optimizer=still, options=quiet(), metrics={"acc": st.accuracy},
        **settings,
    )  # fmt: skip
    with pytest.raises((KeyError, SettingError), match=r"Options\(monitor='val_clean_loss'\)"):
        t.fit(make_graph(), batches(2), val=sets())


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        out = self.lin(x)
        return Done(Opaque(out), metrics={"mean": out.detach().mean()})


def test_node_metrics_carry_the_sets_name():
    torch.manual_seed(0)
    result = st.Trainer(
        loss=F.cross_entropy, optimizer=still, options=quiet(monitor="val_noisy_head/mean")
    ).fit(Graph.somatize(Head()), batches(2), val=sets())
    assert {"val_clean_head/mean", "val_noisy_head/mean"} <= set(result.metrics[0])
    assert result.best == result.metrics[0]["val_noisy_head/mean"]


@pytest.mark.parametrize(
    ("val", "match"),
    [
        ({}, r"val= is an empty dict"),
        ({1: batches(1)}, r"non-empty strings without '/', not 1"),
        ({"a/b": batches(1)}, r"not 'a/b'"),
        ({"": batches(1)}, r"not ''"),
        ({"a": None}, r"val set 'a' is NoneType, not batches"),
        (
            {"a": batches(1), "a_b": batches(1)},
            r"val sets 'a' and 'a_b' would both log 'val_a_b_loss'",
        ),
    ],
)
def test_bad_sets_are_refused_before_any_step(val, match):
    t = st.Trainer(
        loss=F.cross_entropy, optimizer=still, metrics={"b_loss": st.accuracy}, options=quiet()
    )
    with pytest.raises(SettingError, match=match):
        t.fit(make_graph(), batches(1), val=val)


@pytest.mark.parametrize(
    ("val", "match"),
    [
        ([], r"fit\(\)'s val is an empty list: there is nothing to evaluate on.*\(no val=\)"),
        (
            torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(0, 4))),
            r"fit\(\)'s val is an empty DataLoader",
        ),
        ({"a": batches(1), "b": []}, r"val set 'b' is an empty list.*drop it from val="),
    ],
)
def test_an_empty_val_is_refused_before_training_not_at_its_first_evaluation(val, match):
    # without the sanity check it was found an epoch in, as "the evaluation data yielded no
    # batches", naming neither val= nor the set
    stepped = []

    def counted(ps):
        opt = torch.optim.SGD(ps, lr=0.1)
        opt.register_step_post_hook(lambda *_: stepped.append(1))
        return opt

    t = st.Trainer(loss=F.cross_entropy, optimizer=counted, options=quiet(sanity_val_batches=0))
    with pytest.raises(SettingError, match=match):
        t.fit(make_graph(), batches(2), val=val)
    assert not stepped


def test_evaluate_and_predict_take_one_set_and_say_how_to_take_several():
    t = st.Trainer(loss=F.cross_entropy)
    with pytest.raises(SettingError, match=r"evaluate\(\) takes one data set.*sets.items"):
        t.evaluate(make_graph(), sets())
    with pytest.raises(SettingError, match=r"predict\(\) takes one data set"):
        t.predict(make_graph(), sets())


def test_limits_and_the_sanity_check_apply_to_each_set():
    clean, noisy = Counting(batches(2, seed=7)), Counting(batches(3, seed=8))
    g = make_graph()
    t = st.Trainer(
        loss=F.cross_entropy,
        optimizer=still,
        epochs=2,
        options=quiet(monitor="val_clean_loss", limit_val_batches=1, sanity_val_batches=1),
    )
    result = t.fit(g, batches(2), val={"clean": clean, "noisy": noisy})
    assert (clean.read, noisy.read) == (1 + 2, 1 + 2)  # the check, then two evaluations
    assert result.metrics[0]["val_noisy_loss"] == t.evaluate(g, batches(3, seed=8)[:1])["loss"]


def test_the_csv_log_has_a_column_per_sets_metric(tmp_path):
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=still,
        watchers=[st.CSVLog(tmp_path / "log.csv")],
        options=quiet(monitor="val_clean_loss"),
    ).fit(make_graph(), batches(2), val=sets())
    rows = list(csv.DictReader((tmp_path / "log.csv").read_text().splitlines()))
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 1 and evals[0]["val_clean_loss"] and evals[0]["val_noisy_loss"]


@pytest.mark.parametrize("crash_at", [7, 11])
def test_resume_with_several_sets_is_bitwise_identical(tmp_path, crash_at):
    def make(path, watchers=()):
        t = trainer(path, watchers=watchers, pruner=None)
        t.options = st.Options(progress=False, eval_every_steps=4, monitor="val_b_acc", mode="max")
        return t

    def val():
        return {"a": data(2), "b": data(3)}

    reference = make(tmp_path / "ref").fit(graph(0), data(), val=val())
    with pytest.raises(Crash):
        make(tmp_path, watchers=[CrashAt(crash_at)]).fit(graph(0), data(), val=val())
    resumed = make(tmp_path).fit(graph(5), data(), val=val(), resume="last")
    assert_same(resumed, reference)
    assert "val_a_acc" in reference.metrics[0] and "val_b_loss" in reference.metrics[0]


@pytest.mark.parametrize(
    ("val", "which", "kw"),
    [
        (lambda: (b for b in batches(2)), r"val= is a generator", {"epochs": 2}),
        (
            lambda: {"a": batches(1), "b": iter(batches(2))},
            r"val set 'b' is a list_iterator",
            {"options": quiet(eval_every_steps=1)},
        ),
    ],
)
def test_a_one_shot_val_iterator_is_refused_before_any_step_when_it_would_be_read_again(
    val, which, kw
):
    g = make_graph()
    before = {k: v.clone() for k, v in st.module(g).state_dict().items()}
    trainer = st.Trainer(loss=F.cross_entropy, optimizer=still, **kw)
    with pytest.raises(SettingError, match=rf"{which}.*evaluates more than once.*list\(\.\.\.\)"):
        trainer.fit(g, batches(2), val=val())
    assert all(torch.equal(v, st.module(g).state_dict()[k]) for k, v in before.items())


def test_a_one_shot_val_iterator_read_once_is_still_taken():
    result = st.Trainer(loss=F.cross_entropy, optimizer=still, options=quiet()).fit(
        make_graph(), batches(2), val=(b for b in batches(2))
    )
    assert len(result.metrics) == 1


def test_the_result_says_how_many_examples_each_sets_evaluation_averaged_over(tmp_path):
    # fl.weighted_metrics weighs a client's metrics by these, as Flower weighs evaluations
    t = st.Trainer(loss=F.cross_entropy, optimizer=still, epochs=2, options=quiet())
    assert t.fit(make_graph(), batches(2), val=batches(3, size=7)).val_examples == {"val_": 21}
    named = st.Trainer(loss=F.cross_entropy, optimizer=still, options=quiet(monitor="val_a_loss"))
    assert named.fit(
        make_graph(), batches(2), val={"a": batches(1), "a_b": batches(3)}
    ).val_examples == {
        "val_a_": 10,
        "val_a_b_": 30,
    }
    both = st.Trainer(
        loss=F.cross_entropy, optimizer=still, options=quiet(monitor="val_clean_loss")
    )
    assert both.fit(make_graph(), batches(2), val=sets()).val_examples == {
        "val_clean_": 20,
        "val_noisy_": 15,
    }
    limited = st.Trainer(loss=F.cross_entropy, optimizer=still, options=quiet(limit_val_batches=2))
    assert limited.fit(make_graph(), batches(2), val=batches(3, size=7)).val_examples == {
        "val_": 14
    }
    assert t.fit(make_graph(), batches(2)).val_examples == {}  # nothing evaluated
    # a resumed run that evaluates no more still knows its last evaluation's count
    ckpt = st.Trainer(loss=F.cross_entropy, optimizer=still, epochs=2, options=quiet(),
                      checkpoint=st.Checkpointing(tmp_path))  # fmt: skip
    ckpt.fit(make_graph(), batches(2), val=batches(3, size=7))
    again = ckpt.fit(make_graph(), batches(2), val=batches(3, size=7), resume="last")
    assert again.steps == 4 and again.val_examples == {"val_": 21}


def test_a_map_style_dataset_of_batches_is_a_set_as_it_is_a_val():
    class Batches(torch.utils.data.Dataset):  # read by index, not an Iterable
        def __init__(self, items):
            self.items = items

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

    t = st.Trainer(loss=F.cross_entropy, optimizer=still, options=quiet())
    alone = t.fit(make_graph(), batches(2), val=Batches(batches(1))).metrics[0]["val_loss"]
    t = st.Trainer(loss=F.cross_entropy, optimizer=still, options=quiet(monitor="val_a_loss"))
    named = t.fit(make_graph(), batches(2), val={"a": Batches(batches(1))}).metrics[0]
    assert named["val_a_loss"] == pytest.approx(alone)
