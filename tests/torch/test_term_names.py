"""The names of a loss function's terms (``somatize/torch/term_names.py``): the same at every
loss call of a fit, in one process and on every rank under DDP."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.errors import SettingError
from somatize.watchers import StepEnd
from tests.torch.trainer_helpers import make_graph, quiet

FIX = "Return the same terms on every rank and every step: 0.0 for a term absent from a batch"


def data(sizes=(4, 4, 6, 4)):
    """The third batch has 6 rows (3 a micro-batch of 2): the one a term differs on."""
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)) for n in sizes
    ]


def odd(out) -> bool:
    return len(out) in (3, 6)


def appears(out, y):
    ce = F.cross_entropy(out, y)
    return {"loss": ce, "ce": ce, **({"aux": ce * 0} if odd(out) else {})}


def vanishes(out, y):
    ce = F.cross_entropy(out, y)
    return {"loss": ce, **({} if odd(out) else {"ce": ce, "reg": out.pow(2).mean()})}


def becomes_a_dict(out, y):
    ce = F.cross_entropy(out, y)
    return {"loss": ce, "ce": ce} if odd(out) else ce


def becomes_a_scalar(out, y):
    ce = F.cross_entropy(out, y)
    return ce if odd(out) else {"loss": ce, "ce": ce}


def fit(loss, watched=False, micro_batches=1, **kw):
    return st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        micro_batches=micro_batches,
        watchers=[Recorder()] if watched else [],
        options=quiet(shuffle=False),
        **kw,
    ).fit(make_graph(), data())


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("watched", [False, True], ids=["fast-loop", "watched"])
@pytest.mark.parametrize(
    ("loss", "said"),
    [
        (appears, "it gave 'aux', which the fit's first step did not (terms 'ce' at the first)"),
        (vanishes, "it gave no 'ce', 'reg', which it did (terms 'ce', 'reg' at the first)"),
        (
            becomes_a_dict,
            "it gave 'ce', which the fit's first step did not (no terms at the first)",
        ),
        (becomes_a_scalar, "it gave no 'ce', which it did (terms 'ce' at the first)"),
    ],
)
def test_a_step_whose_terms_differ_from_the_first_steps_is_refused_naming_them(
    loss, said, watched, micro_batches
):
    # the same in the fast loop (which drops the terms) as where watchers are told them
    with pytest.raises(SettingError) as e:
        fit(loss, watched, micro_batches)
    message = str(e.value)
    assert message.startswith("the loss function's terms changed at step 3: " + said)
    assert FIX in message
    assert not getattr(e.value, "__notes__", None)  # no note blaming the loss's call


def test_a_loss_without_a_target_is_checked_too():
    def loss(out):
        return {"loss": out.pow(2).mean(), **({"aux": 0.0} if odd(out) else {})}

    with pytest.raises(SettingError, match="terms changed at step 3: it gave 'aux'"):
        fit(loss, split=lambda b: (b[0], None))


def test_the_same_terms_in_another_order_train_and_are_told_as_given():
    def loss(out, y):
        ce = F.cross_entropy(out, y)
        terms = {"ce": ce, "reg": out.pow(2).mean()}
        return {"loss": ce, **(dict(reversed(terms.items())) if odd(out) else terms)}

    recorder = Recorder()
    st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[recorder],
        options=quiet(shuffle=False),
    ).fit(make_graph(), data())
    told = recorder.of(StepEnd)
    assert [sorted(e.terms) for e in told] == [["ce", "reg"]] * 4
    assert all(e.terms["ce"] == e.loss for e in told)


def test_each_fit_fixes_its_own_terms():
    calls = []

    def loss(out, y):  # the first fit's terms, then another fit's
        ce = F.cross_entropy(out, y)
        calls.append(len(out))
        return {"loss": ce, ("ce" if len(calls) <= 4 else "other"): ce}

    trainer = st.Trainer(
        loss=loss, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), options=quiet(shuffle=False)
    )
    for _ in range(2):
        assert len(trainer.fit(make_graph(), data()).losses) == 4


@pytest.mark.slow
def test_ranks_whose_terms_differ_fail_together_naming_them(tmp_path):
    from tests.torch.test_ddp import said, torchrun

    # (no rank left waiting in a collective: the job ends, within the harness's timeout)
    assert torchrun(tmp_path, script="ddp_term_names.py") == 0, said(tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for rank, r in enumerate((r0, r1)):
        for name in ("first", "first_ignore"):  # the first step's all-gather: on every rank
            assert r["said"][name].startswith(
                "the loss function gives other terms on other ranks at step 1: rank 0's terms "
                f"'ce'; rank 1's terms 'ce', 'aux' (this is rank {rank})."
            ), r["said"][name]
            assert FIX in r["said"][name]
    for name in ("later", "later_micro"):  # rank 1's third step: told in its all-reduce
        assert r1["said"][name].startswith(
            "the loss function's terms changed at step 3: it gave 'aux', which the fit's "
            "first step did not (terms 'ce' at the first)."
        ), r1["said"][name]
        assert r0["said"][name].startswith(
            "the loss function of another rank gave other terms at step 3 than at the fit's "
            "first step (terms 'ce', which this rank, rank 0, gave); that rank's error names"
        ), r0["said"][name]
        assert FIX in r0["said"][name] and FIX in r1["said"][name]
    # the same names in another order on rank 1: each averaged by name, in rank 0's order;
    # and the group the failed fits left is whole
    assert r0["said"]["order"] == r1["said"]["order"] == ""
    assert len(r0["steps"]) == 4 and r1["steps"] == []
    for loss, terms, examples in r0["steps"]:
        assert list(terms) == ["ce", "rank"]
        assert terms["ce"] == loss
        assert terms["rank"] == pytest.approx((examples - 4) / examples)  # rank 1's share


def test_an_evaluation_whose_batches_give_other_terms_is_refused_naming_them():
    """An evaluation fixes its terms by its first batch, as a fit by its first step: a term
    left out of a batch would be averaged with 0 there (val_aux about half its value)."""
    import torch.nn.functional as F

    import somatize.torch as st
    from somatize.errors import SettingError
    from tests.torch.trainer_helpers import batches, make_graph

    def by_size(out, y):  # aux only for batches of 10 rows
        ce = F.cross_entropy(out, y)
        return {"loss": ce, "ce": ce, **({"aux": ce * 2} if len(y) == 10 else {})}

    mixed = batches(2) + [(x[:7], y[:7]) for x, y in batches(1, seed=2)]
    trainer = st.Trainer(loss=by_size)
    with pytest.raises(SettingError, match=r"changed between two batches of an evaluation: it "
                       r"gave no 'aux', which it did \(terms 'ce', 'aux' at the first\)"):  # fmt: skip
        trainer.evaluate(make_graph(), mixed)
    got = trainer.evaluate(make_graph(), batches(3))  # every batch gives both: as before
    assert got["aux"] == pytest.approx(2 * got["ce"], rel=1e-12)
    short_first = [mixed[-1], *mixed[:2]]
    with pytest.raises(SettingError, match=r"it gave 'aux', which its first did not"):
        trainer.evaluate(make_graph(), short_first)
