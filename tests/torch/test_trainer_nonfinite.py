"""A NaN or infinite loss: raise (default), skip, or ignore; rotation keeps a finite checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import NonFiniteError, SettingError


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data(n: int = 3):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen))
        for _ in range(n)
    ]


def nan_at(*calls):
    """cross_entropy, NaN at the given (1-based) calls."""
    count = [0]

    def loss(out, y):
        count[0] += 1
        value = F.cross_entropy(out, y)
        return value * float("nan") if count[0] in calls else value

    return loss


def trainer(loss, policy=None, **kw):
    options = st.Options(progress=False, shuffle=False, **({"nonfinite": policy} if policy else {}))
    return st.Trainer(
        loss=loss, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), options=options, **kw
    )


def test_a_nan_loss_raises_naming_step_epoch_and_batch_before_anything_is_stepped(tmp_path):
    torch.manual_seed(0)
    g = Graph.somatize(Linear())
    ckpt = st.Checkpointing(tmp_path / "ckpt", every_steps=1)
    with pytest.raises(NonFiniteError, match=r"step 5 \(epoch 1, batch 1 of the epoch\)") as e:
        trainer(nan_at(5), epochs=2, checkpoint=ckpt).fit(g, data())
    assert "Options(nonfinite='skip')" in str(e.value)
    assert isinstance(e.value, FloatingPointError)
    assert all(torch.isfinite(v).all() for v in st.state(g).values())  # not stepped with NaN
    assert st.load_checkpoint(ckpt.last())["step"] == 4


def test_skip_drops_the_step_and_counts_it():
    torch.manual_seed(0)
    g = Graph.somatize(Linear())
    result = trainer(nan_at(2, 3), "skip", epochs=2).fit(g, data())
    assert (result.steps, result.skipped) == (4, 2)
    assert all(v == v for v in result.losses)  # only the steps taken are in the history
    # equal to training on the batches that were kept, by hand
    torch.manual_seed(0)
    ref = Graph.somatize(Linear())
    kept = [data()[0], *data()]
    want = trainer(F.cross_entropy, epochs=1).fit(ref, kept)
    assert result.losses == pytest.approx(want.losses)
    for k, v in result.state.items():
        assert torch.equal(v, want.state[k])


def test_ignore_trains_on_and_rotation_keeps_the_last_finite_checkpoint(tmp_path):
    torch.manual_seed(0)
    directory = tmp_path / "ckpt"
    result = trainer(
        nan_at(3), "ignore", epochs=2, checkpoint=st.Checkpointing(directory, every_steps=1, keep=2)
    ).fit(Graph.somatize(Linear()), data())
    assert result.steps == 6 and result.skipped == 0
    names = sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))
    assert names == ["step-000000002.ckpt", "step-000000005.ckpt", "step-000000006.ckpt"]
    finite = st.load_checkpoint(directory / "step-000000002.ckpt")["model"]
    assert all(torch.isfinite(v).all() for v in finite.values())
    assert not torch.isfinite(result.state["linear.lin.weight"]).all()


def test_an_unknown_policy_is_refused():
    with pytest.raises(
        ValueError, match="nonfinite must be one of 'raise', 'skip', 'ignore', not 'warn'"
    ):
        st.Options(nonfinite="warn")


def empty():
    return (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize(
    "settings",
    [
        {},  # the fast path
        {"watchers": [st.CSVLog]},  # the general loop (any watcher leaves the fast path)
        {"options": {"accumulate": 2}},  # a step of two batches, the empty one second
    ],
    ids=["fast", "general", "accumulate"],
)
def test_an_empty_batch_is_named_not_blamed_on_the_learning_rate(tmp_path, settings):
    watchers = [w(tmp_path / "log.csv") for w in settings.get("watchers", [])]
    options = st.Options(progress=False, shuffle=False, **settings.get("options", {}))
    t = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=watchers,
        options=options,
    )
    g = Graph.somatize(Linear())
    with pytest.raises(
        SettingError,
        match=r"batch 3 of epoch 0 \(train\[3\]\) has 0 examples .* mean loss is nan; drop "
        "empty batches",
    ):
        t.fit(g, [*data(3), empty()])
    shuffled = trainer(F.cross_entropy)
    shuffled.options = st.Options(progress=False)  # the epoch's order is not the list's
    batches = [empty(), *data(3)]
    with pytest.raises(SettingError, match=r"batch \d of epoch 0 \(train\[0\]\) has 0 examples"):
        shuffled.fit(g, batches)


def test_an_empty_batch_from_a_loader_gets_the_hint_and_is_skipped_under_skip():
    g = Graph.somatize(Linear())
    loader = (b for b in [*data(2), empty()])  # read once: it cannot be looked up again
    with pytest.raises(NonFiniteError, match="a batch of 0 examples has a NaN mean loss"):
        trainer(F.cross_entropy).fit(g, loader)
    result = trainer(F.cross_entropy, "skip").fit(g, [*data(2), empty()])
    assert (result.steps, result.skipped) == (2, 1)


def overflowing_at(*calls):
    """cross_entropy plus 0 * sqrt(0) at the given calls: the loss stays finite, the
    gradients' norm is NaN (sqrt's gradient at 0 is inf, times 0)."""
    count = [0]

    def loss(out, y):
        count[0] += 1
        value = F.cross_entropy(out, y)
        if count[0] in calls:
            value = value + 0.0 * torch.sqrt(out - out.detach()).sum()
        return value

    return loss


class Seen:
    """A watcher (any watcher makes the Trainer take its full loop, not the fast one)."""

    def __init__(self) -> None:
        self.events = 0

    def on_event(self, event) -> None:
        self.events += 1


@pytest.mark.parametrize("fast", [True, False], ids=["fast loop", "full loop"])
def test_under_clipping_a_finite_loss_with_a_nan_gradient_raises_or_is_skipped(fast):
    def run(policy):
        torch.manual_seed(0)
        g = Graph.somatize(Linear())
        options = st.Options(progress=False, shuffle=False, nonfinite=policy, clip_grad_norm=1.0)
        t = st.Trainer(
            loss=overflowing_at(2),
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            options=options,
            watchers=[] if fast else [Seen()],
        )
        return g, t.fit(g, data())

    with pytest.raises(
        NonFiniteError, match=r"gradients' norm is nan at step 2 \(epoch 0, batch 1"
    ):
        run("raise")
    g, result = run("skip")
    assert result.skipped == 1 and result.steps == 2
    assert all(torch.isfinite(v).all() for v in st.state(g).values())
    g, result = run("ignore")  # stepped, as plain PyTorch would: NaN weights
    assert result.skipped == 0
    assert not all(torch.isfinite(v).all() for v in st.state(g).values())


class Masked(nn.Module):
    """A NaN made in a backward alone: the forward masks sqrt(s) at s = -1 (a finite loss),
    the backward of sqrt there is NaN (docs/trainer.md, non-finite losses)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.s = nn.Parameter(-torch.ones(1))

    def forward(self, x):
        return self.lin(x) + torch.where(self.s > 0, torch.sqrt(self.s), torch.zeros(1))


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")  # (torch's, asked for)
@pytest.mark.filterwarnings("ignore:Error detected in SqrtBackward0")  # (the forward's traceback)
def test_a_nan_made_in_a_backward_alone_is_warned_of_and_seen_under_clipping_or_anomaly():
    # what the docs say of Lightning's detect_anomaly=True: the loss check alone misses it
    def fit(model, **options):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            options=st.Options(progress=False, **options),
        ).fit(model, data())

    # every loss finite, the weights NaN: before, the fit ended without a word
    with pytest.warns(RuntimeWarning, match=r"ended with non-finite weights in 's', though") as w:
        missed = fit(Masked())
    assert all(map(math.isfinite, missed.losses)) and torch.isnan(missed.state["s"]).all()
    assert "torch.autograd.detect_anomaly()" in str(w[0].message)
    assert w[0].filename == __file__  # (the user's line: fit's caller)
    ignored = fit(Masked(), nonfinite="ignore")  # no checks asked for: none made
    assert torch.isnan(ignored.state["s"]).all()
    with pytest.raises(NonFiniteError, match="norm"):
        fit(Masked(), clip_grad_norm=1.0)
    with (
        pytest.raises(RuntimeError, match="'SqrtBackward0' returned nan values"),
        torch.autograd.detect_anomaly(),
    ):
        fit(Masked())
