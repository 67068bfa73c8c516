"""A loss of several terms: ``loss=fn`` returning ``{"loss": total, "recon": r, "kl": k}``.

The entry ``"loss"`` is the scalar tensor trained on; every other entry is a *term*, a 0-d
tensor or a real number that is logged (detached) and never trained on — what a Lightning
user logs in ``training_step`` with ``self.log("train_recon", r)``. A training step weighs
its terms over micro-batches, accumulated batches and ranks as it weighs its loss
(``step.py``), and ``StepEnd.terms`` carries them; an evaluation averages each over examples
as ``val_<term>`` (``inference.py``, through ``metrics.evaluate(aside=)``).

Only a loss *function* gets terms: without ``loss=`` a graph whose output is a dict holding
``"loss"`` (a Hugging Face model's) is refused, as it was (``_holds_loss``).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import torch

from ..errors import SettingError
from .term_names import changed_in_evaluation

__all__ = [
    "RESERVED",
    "KeptTerms",
    "Terms",
    "add_weighed",
    "check_clash",
    "gives_terms",
    "loss_terms",
    "record_terms",
    "refused_return",
    "restored_terms",
    "scalar_and_terms",
]

#: Names a term cannot take: the values logged beside the loss (StepEnd's fields, CSVLog's
#: columns, TensorBoard's ``train/<name>`` tags)
RESERVED = frozenset(
    {"loss", "kind", "step", "epoch", "lr", "examples", "seconds", "grad_norm"}
    | {"examples_per_second"}
)

Terms = dict[str, Any]  # name -> a detached 0-d tensor, or a float


def loss_terms(
    loss: Callable[..., Any] | None, output: Any, target: Any
) -> tuple[torch.Tensor, Terms]:
    """The scalar loss of a batch and its terms: ``loss(output, target)``, ``loss(output)``
    without a target, or the output itself when there is no loss function (the graph
    computes it; it has no terms).

    Raises:
        TypeError: the loss is not a scalar tensor (a ``SettingError``, also a
            ``TypeError``, for a dict that is not ``{"loss": scalar, name: number...}``).
    """
    if loss is None:
        value = output
    elif target is None:
        value = loss(output)
    else:
        value = loss(output, target)
    if type(value) is torch.Tensor and value.dim() == 0:  # the common case
        return value, {}
    return scalar_and_terms(loss, value)


def scalar_and_terms(loss: Callable[..., Any] | None, value: Any) -> tuple[torch.Tensor, Terms]:
    """What the loss function ``loss`` returned, ``value``, as ``(scalar, terms)``; raised
    here, not in the caller's frame (``first_step._loss_call``: no "the loss function
    failed" note on a value it returned)."""
    if isinstance(value, Mapping):
        if loss is None and "loss" in value:
            raise SettingError(_holds_loss(value))
        if loss is not None:
            wrong = _wrong(value)
            if wrong is not None:
                raise SettingError(wrong)
            return value["loss"], {
                k: v.detach() if isinstance(v, torch.Tensor) else float(v)
                for k, v in value.items()
                if k != "loss"
            }
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
        raise TypeError(
            f"the loss must be a scalar tensor, got {type(value).__name__}{shape}; "
            "pass loss=fn(output, target) returning a mean (or a dict {'loss': mean, "
            "'<term>': value, ...}, its other entries logged), or make the graph output the loss"
        )
    return value, {}


def add_weighed(into: Terms, terms: Terms, share: float) -> None:
    """Add ``terms`` (a micro-batch's), each weighed by ``share``, into ``into``: as a step
    adds its loss — in float32, a micro-batch after the other (a number stays a float)."""
    for k, v in terms.items():
        part = (v.float() if isinstance(v, torch.Tensor) else v) * share
        into[k] = into[k] + part if k in into else part


def record_terms(history: dict[str, list[float]], terms: Terms, steps: int) -> None:
    """Add a step's ``terms`` to ``history`` (``TrainResult.terms``: name -> a value per step),
    ``steps`` the steps recorded with this one, so that each list stays as long as the
    losses: a term first given at a later step is NaN at the steps before it (a run resumed
    from a checkpoint without the history), a term a step does not give NaN at that step (a
    fit's steps give the same terms: ``term_names.py``)."""
    for k, v in terms.items():
        kept = history.get(k)
        if kept is None:
            kept = history[k] = [math.nan] * (steps - 1)
        kept.append(float(v))
    if len(history) != len(terms):
        for kept in history.values():
            if len(kept) < steps:
                kept.append(math.nan)


def restored_terms(saved: Any, steps: int) -> dict[str, list[float]]:
    """A checkpoint's ``terms`` history (None from a checkpoint written before it was kept:
    none yet, each term NaN at the steps before the resume, as ``record_terms`` pads)."""
    if not isinstance(saved, Mapping):
        return {}
    return {
        str(k): [float(v) for v in values][:steps]
        for k, values in saved.items()
        if isinstance(values, list)
    }


def _wrong(value: Mapping[Any, Any]) -> str | None:
    """What is wrong with a loss function's dict, naming the entry and the fix; None: fine."""
    fix = "return {'loss': recon + 0.1 * kl, 'recon': recon, 'kl': kl}"
    if "loss" not in value:
        keys = ", ".join(map(repr, list(value)[:6])) + (", ..." if len(value) > 6 else "")
        return (
            f"the loss function returned a {type(value).__qualname__} without a 'loss' entry "
            f"({keys}): a dict from loss= holds 'loss', the scalar trained on, and terms to "
            f"log beside it; {fix}"
        )
    total = value["loss"]
    if not isinstance(total, torch.Tensor) or total.dim() != 0:
        shape = f" of shape {tuple(total.shape)}" if isinstance(total, torch.Tensor) else ""
        return (
            f"the loss function's 'loss' entry is a {type(total).__name__}{shape}, not a "
            "scalar tensor: it is what is trained on (backward), a mean over the batch; "
            f"reduce it (.mean()) — {fix}"
        )
    for k, v in value.items():
        if not isinstance(k, str):
            return (
                f"the loss function's dict has the key {k!r} ({type(k).__qualname__}); terms "
                f"are named by strings, logged as train_<name> and val_<name>: {fix}"
            )
        if k == "loss":
            continue
        if k not in _NAMED_WELL:  # (a name checked once: a loss gives the same every step)
            named = _badly_named(k)
            if named is not None:
                return named
            if len(_NAMED_WELL) < 1024:
                _NAMED_WELL.add(k)
        if isinstance(v, torch.Tensor):
            if v.dim() != 0:
                return (
                    f"the loss function's term {k!r} is a tensor of shape {tuple(v.shape)}; a "
                    "term is one number per batch (a mean), logged: reduce it, e.g. "
                    f"{k!r}: {k}.mean()"
                )
        elif not isinstance(v, numbers.Real):
            return (
                f"the loss function's term {k!r} is a {type(v).__qualname__} ({v!r:.40}), not "
                "a number; a term is a 0-d tensor or a real number, logged beside the loss"
            )
    return None


_NAMED_WELL: set[str] = set()  # term names _badly_named found fine


def _badly_named(k: str) -> str | None:
    if not k.strip() or "/" in k:
        why = "is blank" if not k.strip() else "holds '/' (which names a node's metric)"
        return f"the loss function's term {k!r} {why}: name it with a plain word, e.g. 'recon'"
    if k in RESERVED:
        return (
            f"the loss function's term {k!r} has the name of a value logged beside the loss "
            f"({', '.join(sorted(RESERVED))}: StepEnd's fields, CSVLog's columns, TensorBoard's "
            f"train/<name>); rename it, e.g. {k + '_term'!r}"
        )
    if k.startswith("val_"):
        return (
            f"the loss function's term {k!r} would be evaluated as 'val_{k}': name terms "
            f"without the val_ prefix ({k[4:]!r}), they are prefixed when evaluated"
        )
    if k.startswith("epoch_"):
        return (
            f"the loss function's term {k!r} has the name of an epoch's mean of a term "
            f"(TensorBoard's train/epoch_<term>, CSVLog's epoch_<term> column): name terms "
            f"without the epoch_ prefix ({k[6:]!r}), they are prefixed there"
        )
    return None


def check_clash(terms: Mapping[str, Any], metrics: Mapping[str, Any], who: str) -> None:
    """A term named as one of ``metrics=``: one value would overwrite the other."""
    for k in terms:
        if k in metrics:
            raise SettingError(
                f"the loss function's term {k!r} has the name of the metric {k!r} of "
                f"{who}(metrics=...): both would be evaluated as 'val_{k}'; rename one "
                f"(e.g. the term {k + '_term'!r})"
            )


def refused_return(e: BaseException) -> bool:
    """Whether ``e`` is this module's refusal of what a loss function *returned* (a dict
    without ``"loss"``, a term badly named or named as a metric), raised by ``scalar_and_terms``
    or ``check_clash`` themselves: its message says what to return, and a note on how the
    loss is called ("raised in the loss function, called as...") would blame the call."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:  # (the frame that raised it)
        tb = tb.tb_next
    return tb.tb_frame.f_code in (scalar_and_terms.__code__, check_clash.__code__)


def _holds_loss(output: Mapping[Any, Any]) -> str:
    """Without ``loss=``, an output that holds its loss (a Hugging Face model's)."""
    keys = ", ".join(map(repr, list(output)[:4])) + (", ..." if len(output) > 4 else "")
    return (
        f"the model returned a {type(output).__qualname__} ({keys}), not its loss: without "
        "loss= the model's output is the loss, a scalar tensor. Return out['loss'] from the "
        "model, or pick it out with loss=lambda out: out['loss'], split=lambda batch: "
        "(batch, None) — the model still gets the whole batch, and the loss is called "
        "with its output alone"
    )


def gives_terms(loss: Callable[..., Any] | None) -> TypeGuard[Callable[..., Any]]:
    """Whether ``loss`` may return terms: a function of your own. torch's losses
    (``F.cross_entropy``, ``nn.MSELoss()``, a ``functools.partial`` of one) never do, so
    what is evaluated with them is known before any call."""
    if loss is None:
        return False
    fn = loss.func if isinstance(loss, functools.partial) else loss
    where = (
        type(fn).__module__ if isinstance(fn, torch.nn.Module) else getattr(fn, "__module__", "")
    )
    return not (isinstance(where, str) and where.startswith("torch."))


class KeptTerms:
    """The loss an evaluation calls as a metric ``fn(output, target)``: the scalar, each
    batch's terms kept for ``take`` (``metrics.evaluate(aside=)``) and checked against the
    ``metrics=`` names; ``names``, the terms in the order the loss gave them."""

    def __init__(self, loss: Callable[..., Any], metrics: Mapping[str, Any], who: str) -> None:
        self.loss, self.metrics, self.who = loss, metrics, who
        self.names: list[str] = []
        self._terms: Terms = {}
        self._seen = False  # whether a batch gave the names the others must give

    def __call__(self, output: Any, target: Any) -> torch.Tensor:
        value, terms = loss_terms(self.loss, output, target)
        names = self.names
        if not self._seen:  # the evaluation's first batch fixes its terms, as a fit's step
            check_clash(terms, self.metrics, self.who)
            self.names, self._seen = list(terms), True
        elif len(terms) != len(names) or any(k not in terms for k in names):
            raise SettingError(changed_in_evaluation(names, terms))
        self._terms = terms
        return value

    def take(self) -> Terms:
        """The terms of the batch the loss was last called on (then forgotten)."""
        terms, self._terms = self._terms, {}
        return terms
