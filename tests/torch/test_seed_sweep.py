"""A sweep seeded through the global generator (``torch.manual_seed(s)`` before each fit of
a Trainer given no ``seed=``) warns once, naming ``seed=``; a single fit, an explicit seed,
the same global seed again and a smoke run's inner fit do not."""

import warnings

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.torch.seed_sweep import forget_sites


class Dropped(Node):
    def __init__(self):
        self.lin, self.drop = nn.Linear(4, 3), nn.Dropout(0.5)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(self.drop(x))))


_gen = torch.Generator().manual_seed(1)
DATA = [
    (torch.randn(8, 4, generator=_gen), torch.randint(0, 3, (8,), generator=_gen)) for _ in range(4)
]
OPTIONS = st.Options(progress=False)


@pytest.fixture(autouse=True)
def _no_sites_seen():
    forget_sites()
    yield
    forget_sites()


def trainer(**kw) -> st.Trainer:
    return st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        options=kw.pop("options", OPTIONS),
        **kw,
    )


def sweep(seeds, **kw) -> list[warnings.WarningMessage]:
    """``torch.manual_seed(s)``, a fresh graph and a fit for each seed, from one line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in seeds:
            torch.manual_seed(s)
            trainer(**kw).fit(Graph.somatize(Dropped()), DATA)
    return [w for w in caught if "seed=" in str(w.message)]


def test_a_sweep_of_global_seeds_with_no_trainer_seed_warns_once_at_the_fit_line():
    caught = sweep(range(4))
    assert len(caught) == 1  # once for the line, not at every run
    w = caught[0]
    assert w.category is UserWarning and w.filename == __file__
    text = str(w.message)
    assert "was 0 at the previous fit from this line and is 1 now" in text
    assert "st.Trainer(..., seed=s)" in text and "campaigns.md" in text


def test_what_it_warns_of_the_runs_share_their_training_draws():
    """The pitfall is real: two global seeds, the same dropout masks and order — the runs
    differ by their initial weights only; with seed=s they differ in training as well."""

    torch.manual_seed(123)
    init = st.state(Graph.somatize(Dropped()))

    def fitted(global_seed, **kw):
        g = Graph.somatize(Dropped())
        st.load_state(g, init)
        torch.manual_seed(global_seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return trainer(**kw).fit(g, DATA).losses

    assert fitted(1) == fitted(2)  # global seeds 1 and 2: one training
    assert fitted(1, seed=1) != fitted(2, seed=2)


def test_a_single_fit_after_a_global_seed_does_not_warn():
    assert sweep([5]) == []


def test_the_same_global_seed_again_does_not_warn():
    assert sweep([3, 3, 3]) == []  # a cell run again, random restarts after one seed


def test_an_explicit_seed_never_warns():
    assert sweep(range(3), seed=0) == []  # one order on purpose
    forget_sites()
    assert sweep(range(3), seed=7) == []


def test_a_smoke_run_warns_once_not_for_its_inner_fit():
    caught = sweep(range(3), options=st.Options(progress=False, smoke=1))
    assert len(caught) == 1 and caught[0].filename == __file__


def test_lightning_seed_everything_that_the_trainer_does_not_follow_warns(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # (restored after the test)
    from lightning.pytorch import seed_everything

    seed_everything(42, verbose=False)
    with pytest.warns(UserWarning, match=r"seed_everything\(42\).*follow seed=0, not 42"):
        trainer().fit(Graph.somatize(Dropped()), DATA)
    forget_sites()
    seed_everything(0, verbose=False)  # the Trainer's own seed: nothing to say
    assert sweep([0]) == []


def test_a_stale_lightning_seed_after_torch_was_seeded_again_does_not_warn(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "42")  # set long ago, by another test say
    assert sweep([3]) == []  # torch's seed is 3 now: the variable says nothing of this fit
