"""The names of a loss function's terms (``loss_terms.py``): the same at every loss call of
a fit, and on every rank.

A term logged on some steps only would be averaged over steps it was absent from (the
epoch's mean, ``EpochLoss``), and under DDP, where the step's all-reduce carries the terms
by position (``step._over_ranks``), zipped with another rank's — or, of another number,
an all-reduce of tensors of different lengths: a hang, or gloo's opaque error. So a fit's
first loss call fixes the names, in its order; under DDP every rank's are compared then,
in one all-gather (once a fit, before the step's all-reduce), and differing names are a
``SettingError`` on every rank, naming each rank's, in the order rank 0 gave them. Every
later call must give the same names (in any order). Under DDP with the non-finite check's
all-reduce a rank whose names changed says so in it (``_over_ranks``'s ``changed`` slot),
and every rank raises at that step together, none left waiting in a collective; under
``nonfinite="ignore"`` (no all-reduce a step) that rank raises alone, and its peers fail
when the Trainer destroys its process group (``ddp.finish``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SettingError

if TYPE_CHECKING:
    from .run import ActiveRun

__all__ = [
    "NO_TERMS",
    "changed",
    "changed_in_evaluation",
    "check",
    "first",
    "fixed",
    "other_rank_changed",
]

#: The names of a loss that gives no terms (a scalar): ``first``'s return for it, the same
#: object each time, so the fast loop tells it by identity
NO_TERMS: tuple[str, ...] = ()

FIX = (
    "Return the same terms on every rank and every step: 0.0 for a term absent from a "
    "batch, e.g. out['aux'] = aux if mask.any() else 0.0"
)


def check(run: ActiveRun, terms: Mapping[str, Any], defer: bool = False) -> bool:
    """Whether a loss call's ``terms`` name other terms than the fit's; its first call fixes
    them (``first``). ``defer``: say so (True) for the step's all-reduce to tell every rank;
    else raise here.

    Raises:
        SettingError: the names differ (from the fit's, or, at its first call, between ranks).
    """
    names = run.term_names
    if names is None:
        run.term_names = first(terms, run.rank, run.world, run.state.step + 1)
        return False
    if len(terms) == len(names) and all(k in terms for k in names):
        return False
    if defer:
        return True
    raise SettingError(changed(names, terms, run.state.step + 1))


def fixed(
    names: tuple[str, ...] | None, terms: Mapping[str, Any], rank: int, world: int, step: int
) -> tuple[str, ...]:
    """A fit's names after a loss call at ``step`` gave ``terms``: fixed by its first call
    (``names`` None: ``first``, a collective under DDP), then checked (``LightningGraph``'s).

    Raises:
        SettingError: the names differ (from the fit's, or, at its first call, between ranks).
    """
    if names is None:
        return first(terms, rank, world, step)
    if len(terms) == len(names) and all(k in terms for k in names):
        return names
    raise SettingError(changed(names, terms, step))


def first(terms: Mapping[str, Any], rank: int, world: int, step: int) -> tuple[str, ...]:
    """The names of a fit's first loss call, in its order (``NO_TERMS`` for none); under DDP
    every rank's, compared in one all-gather, in rank 0's order.

    Raises:
        SettingError: on every rank, when a rank's names differ from another's.
    """
    names = tuple(terms) or NO_TERMS
    if world <= 1:
        return names
    from . import ddp

    every = [tuple(r) for r in ddp.gather(names)]
    if all(set(r) == set(names) for r in every):  # (every rank holds the same list)
        return every[0] or NO_TERMS
    said = "; ".join(f"rank {r}'s {_listed(n)}" for r, n in enumerate(every))
    raise SettingError(
        f"the loss function gives other terms on other ranks at step {step}: {said} (this "
        f"is rank {rank}). Under DDP each term is averaged over the ranks, name by name, so "
        f"every rank's loss must name the same ones. {FIX}"
    )


def changed(names: Sequence[str], terms: Mapping[str, Any], step: int) -> str:
    """The message for a loss call whose ``terms`` differ from the fit's ``names``."""
    new = [k for k in terms if k not in names]
    gone = [k for k in names if k not in terms]
    what = []
    if new:
        what.append(f"{_quoted(new)}, which the fit's first step did not")
    if gone:
        what.append(f"no {_quoted(gone)}, which it did")
    return (
        f"the loss function's terms changed at step {step}: it gave {' and '.join(what)} "
        f"({_listed(names)} at the first). A term given on some steps only would be "
        f"averaged over steps it was absent from, and under DDP mixed with another rank's "
        f"terms. {FIX}"
    )


def changed_in_evaluation(names: Sequence[str], terms: Mapping[str, Any]) -> str:
    """The message for an evaluation batch whose terms are not its first batch's (an
    evaluation fixes its own: ``loss_terms.KeptTerms``)."""
    new, gone = [k for k in terms if k not in names], [k for k in names if k not in terms]
    what = [f"{_quoted(new)}, which its first did not"] if new else []
    what += [f"no {_quoted(gone)}, which it did"] if gone else []
    return (
        f"the loss function's terms changed between two batches of an evaluation: it gave "
        f"{' and '.join(what)} ({_listed(names)} at the first). Each term is averaged over "
        f"the set's examples, so a term left out of a batch would count as 0 there. {FIX}"
    )


def other_rank_changed(names: Sequence[str], step: int, rank: int) -> str:
    """The message for a rank whose terms are the fit's, at a step where another's were not."""
    return (
        f"the loss function of another rank gave other terms at step {step} than at the "
        f"fit's first step ({_listed(names)}, which this rank, rank {rank}, gave); that "
        f"rank's error names them. {FIX}"
    )


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(map(repr, names))


def _listed(names: Sequence[str]) -> str:
    return f"terms {_quoted(names)}" if names else "no terms"
