"""``Options(deterministic=...)``: torch's deterministic settings during ``fit`` — seen by
the nodes' forward — and put back as they were when it returns or fails."""

from __future__ import annotations

import os
import random

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError

SEEN: list[tuple[bool, bool, bool, bool, str | None]] = []


def flags() -> tuple[bool, bool, bool, bool, str | None]:
    cudnn = torch.backends.cudnn
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.deterministic,
        cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


class Watch(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(2, 1)

    def forward(self, x, ctx):
        SEEN.append(flags())
        if ctx.step == 2 and FAIL:
            raise RuntimeError("failing at step 2")
        return Done(Opaque(self.lin(x)))


FAIL = False


def fit(mode) -> None:
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(3)]
    st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(deterministic=mode, progress=False),
    ).fit(Graph.somatize(Watch()), data)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    global FAIL
    FAIL = False
    SEEN.clear()
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    ("mode", "inside"),
    [
        (True, (True, False, True, False, ":4096:8")),
        ("warn", (True, True, True, False, ":4096:8")),
        (False, (False, False, False, torch.backends.cudnn.benchmark, None)),
    ],
)
def test_the_settings_hold_during_fit_and_are_put_back_after(mode, inside):
    before = flags()
    fit(mode)
    assert SEEN and all(seen == inside for seen in SEEN)
    assert flags() == before


def test_none_leaves_torchs_settings_as_they_are():
    torch.use_deterministic_algorithms(True, warn_only=True)
    before = flags()
    fit(None)
    assert all(seen == before for seen in SEEN) and flags() == before


def test_false_turns_them_off_for_the_fit_and_back_on_after(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    torch.use_deterministic_algorithms(True)
    fit(False)
    assert all(not seen[0] for seen in SEEN)
    assert flags()[0] and flags()[4] == ":16:8"  # the user's own setting kept


def test_they_are_put_back_when_fit_fails():
    global FAIL
    FAIL = True
    before = flags()
    with pytest.raises(RuntimeError, match="failing at step 2"):
        fit(True)
    assert SEEN[0][0] and flags() == before


@pytest.mark.parametrize("bad", ["yes", 1, "strict"])
def test_other_values_are_refused_naming_the_choices(bad):
    with pytest.raises(SettingError, match=r"deterministic must be True, False, 'warn' or None"):
        st.Options(deterministic=bad)


def test_a_fit_starting_while_another_runs_in_this_process_warns_they_share_the_generators():
    import threading

    from somatize.watchers import FitStart

    first_started, second_done = threading.Event(), threading.Event()

    class Holds:  # keeps the first fit running until the second one has started
        def on_event(self, event):
            if isinstance(event, FitStart):
                first_started.set()
                second_done.wait(60)

    def fit(watchers):
        batches = [(torch.randn(4, 3), torch.randint(0, 2, (4,)))]
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            watchers=watchers,
            options=st.Options(progress=False),
        )
        trainer.fit(nn.Linear(3, 2), batches)

    first = threading.Thread(target=fit, args=([Holds()],))
    first.start()
    try:
        assert first_started.wait(60)
        with pytest.warns(RuntimeWarning, match="starts while 1 other.*same global generators"):
            fit([])
    finally:
        second_done.set()
        first.join(60)
    fit([])  # alone again: no warning (warnings are errors here)


def draws() -> tuple[float, float, float]:
    import numpy as np

    return random.random(), float(np.random.rand()), torch.rand(()).item()


def seed_all(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.parametrize("fails", [False, True], ids=["returns", "fails"])
def test_fit_gives_the_callers_generators_back_so_what_follows_draws_as_if_it_had_not_run(fails):
    global FAIL
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(3)]
    g = Graph.somatize(Watch())
    trainer = st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),  # shuffles: the fit draws for itself
    )
    seed_all(7)
    expected = draws()
    seed_all(7)
    FAIL = fails
    if fails:
        with pytest.raises(RuntimeError, match="failing at step 2"):
            trainer.fit(g, data)
    else:
        trainer.fit(g, data)
    assert draws() == expected


def test_models_made_after_fits_start_from_different_weights() -> None:
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(3)]
    trainer = st.Trainer(
        loss=nn.functional.mse_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    inits = []
    for _ in range(3):  # random restarts, as a user writes them: the fits re-seed nothing after
        g = Graph.somatize(Watch())
        inits.append(g["watch"].lin.weight.clone())
        trainer.fit(g, data)
    assert not torch.equal(inits[1], inits[2])
