"""Options(sanity_val_batches=2): val batches evaluated before training, changing nothing."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.errors import SettingError
from somatize.watchers import Metrics, StepEnd
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, graph
from tests.torch.test_resume_random_data import Augmented
from tests.torch.test_trainer_min_epochs import Answers
from tests.torch.trainer_helpers import batches, make_graph, quiet


class Counting:
    """Re-iterable batches that count how many are read."""

    def __init__(self, data) -> None:
        self.data, self.read = data, 0

    def __iter__(self):
        for b in self.data:
            self.read += 1
            yield b


def fit(n, model=None, train=None, val=None, epochs=2, **kw):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=epochs,
        **kw,
        options=quiet(sanity_val_batches=n),
    ).fit(model if model is not None else make_graph(), train or batches(3), val=val)


def test_the_check_changes_nothing_the_run_computes_with_dropout_and_random_val_data():
    """Val reading draws from the global RNG (augmentation, a shuffled sampler without a
    generator of its own) and the model drops out: the check must put every state back."""

    def run(n):
        loader = DataLoader(Augmented(), batch_size=6, shuffle=True)
        val = DataLoader(Augmented(), batch_size=8, shuffle=True)
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, lr=2e-2),
            scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0),
            epochs=3,
            metrics={"acc": st.accuracy},
            pruner=st.Patience("val_loss", patience=5),
            seed=5,
            options=quiet(sanity_val_batches=n),
        ).fit(graph(0), loader, val=val)

    checked, unchecked = run(2), run(0)
    assert_same(checked, unchecked)
    assert len(checked.metrics) == 3  # its values are not recorded


def test_a_val_loader_with_a_generator_of_its_own_starts_where_it_would_have():
    """A shuffled val loader with a generator of its own: after the check, the first real
    evaluation reads the same (limited) batches as without it (every reading of a loader
    draws from generators the Trainer seeds by epoch, batches.epoch_batches)."""

    def run(n):
        val = DataLoader(
            Augmented(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)
        )
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, lr=2e-2),
            epochs=2,
            seed=5,
            options=quiet(sanity_val_batches=n, limit_val_batches=1),
        ).fit(graph(0), batches(3), val=val)

    checked, unchecked = run(2), run(0)
    assert_same(checked, unchecked)
    assert [m["val_loss"] for m in checked.metrics] == [m["val_loss"] for m in unchecked.metrics]


def test_batch_norm_statistics_are_untouched_by_the_check():
    def run(n):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
        return fit(n, model, val=batches(2, seed=9))

    checked, unchecked = run(2), run(0)
    assert checked.losses == unchecked.losses
    for k, v in unchecked.state.items():
        assert torch.equal(checked.state[k], v), k


def test_a_broken_validation_fails_before_any_step():
    rec = Recorder()
    g = make_graph()
    before = {k: v.clone() for k, v in st.state(g).items()}
    wrong = [(torch.randn(5, 7), torch.randint(0, 3, (5,)))]  # 7 features, the model takes 4
    with pytest.raises(RuntimeError) as info:
        fit(2, g, val=wrong, watchers=[rec])
    assert rec.of(StepEnd) == []  # nothing trained
    assert all(torch.equal(v, before[k]) for k, v in st.state(g).items())
    if sys.version_info >= (3, 11):
        assert "sanity check before training" in "\n".join(info.value.__notes__)
        assert "Options(sanity_val_batches=0)" in "\n".join(info.value.__notes__)
    with pytest.raises(RuntimeError):  # off, the same failure comes after the first epoch
        fit(0, make_graph(), val=wrong, watchers=[rec])
    assert len(rec.of(StepEnd)) == 3


def test_its_values_reach_no_watcher_no_record_and_no_pruner():
    rec, pruner = Recorder(), Answers([False, False])
    val = Counting(batches(3, seed=9))
    result = fit(2, val=val, watchers=[rec], pruner=pruner)
    assert val.read == 2 + 3 + 3  # the check read two batches, each evaluation three
    assert pruner.reported == [3, 6]
    assert [e.step for e in rec.of(Metrics) if e.node == ""] == [3, 6]
    assert [m["step"] for m in result.metrics] == [3, 6]


@pytest.mark.parametrize(
    ("n", "limit", "read"), [(2, None, 2), (5, None, 3), (2, 1, 1), (0, None, 0)]
)
def test_it_reads_at_most_n_batches_and_no_more_than_the_val_limit(n, limit, read):
    val = Counting(batches(3, seed=9))
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=quiet(sanity_val_batches=n, limit_val_batches=limit, eval_every_epochs=None),
    ).fit(make_graph(), batches(2), val=val)
    evaluation = 3 if limit is None else limit
    assert val.read == read + evaluation


def test_a_resumed_run_is_not_checked_again(tmp_path):
    def trainer(watchers=()):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=2),
            watchers=watchers,
            options=quiet(),
        )

    with pytest.raises(Crash):
        trainer([CrashAt(3)]).fit(make_graph(), batches(3), val=batches(2))
    val = Counting(batches(2, seed=9))
    trainer().fit(make_graph(), batches(3), val=val, resume="last")
    assert val.read == 2 * 2  # the two epoch-end evaluations only


def test_a_one_shot_val_iterator_is_not_used_up_by_the_check():
    val = batches(2, seed=9)
    result = fit(2, val=(b for b in val), epochs=1)
    want = st.Trainer(loss=F.cross_entropy).evaluate(make_graph(), val)  # before any step
    assert result.metrics and result.metrics[0]["val_loss"] != want["loss"]  # it trained...
    g = make_graph()
    st.load_state(g, result.state)
    assert result.metrics[0]["val_loss"] == pytest.approx(
        st.Trainer(loss=F.cross_entropy).evaluate(g, val)["loss"], rel=1e-6
    )  # ...and evaluated both batches


def test_a_model_with_lazy_parameters_is_not_checked():
    """The check's forward would initialise them from the RNG, which it then puts back:
    dropout would then draw the masks the initialisation drew — another run."""

    def run(n):
        torch.manual_seed(0)
        model = nn.Sequential(nn.LazyLinear(8), nn.Dropout(0.5), nn.Linear(8, 3))
        return fit(n, model, val=batches(2, seed=9))

    checked, unchecked = run(2), run(0)
    assert checked.losses == unchecked.losses


class Embed(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 8)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Classify(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(8, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def test_a_graph_that_remembers_a_node_is_not_checked():
    """Its val rows would be in the keeper before the first epoch: that epoch's counts (and
    what it computes) would change."""

    def run(n):
        torch.manual_seed(0)
        g = Graph.somatize(Embed().with_id("enc") >> Classify())
        g.freeze("enc").cache("enc", per="example")
        data = batches(3)
        return fit(n, g, train=data, val=data[:2])  # val rows are training rows

    checked, unchecked = run(2), run(0)
    assert checked.cache == unchecked.cache == {"enc": {"hits": 30, "misses": 30}}
    assert checked.losses == unchecked.losses


def test_a_val_loader_with_persistent_workers_is_not_checked():
    class Persistent(Counting):
        persistent_workers, num_workers = True, 1  # their RNG streams would run on

    val = Persistent(batches(2, seed=9))
    fit(2, val=val)
    assert val.read == 2 * 2


@pytest.mark.parametrize("value", [-1, 1.5, None])
def test_bad_values_are_refused(value):
    with pytest.raises(SettingError, match="sanity_val_batches must be"):
        st.Options(sanity_val_batches=value)
