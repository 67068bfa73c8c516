"""One optimizer step: forward, loss and backward over its batches (in micro-batches), then
the step — with a gradient scaler under fp16, clipping, and the non-finite policy."""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import NonFiniteError, SettingError
from . import ddp, term_names
from .batches import chunk, epoch_batches, num_examples, to_device
from .loss_terms import Terms, add_weighed, loss_terms
from .module_reads import fit_metrics
from .reduction import check_summed_value
from .settings import check_batch
from .term_names import NO_TERMS

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["step"]


def step(
    trainer: Trainer, run: ActiveRun, group: Sequence[Any], index: int
) -> tuple[torch.Tensor | float, int, bool]:
    """One optimizer step over ``group`` (one batch, or ``Options.accumulate`` of them).

    Every micro-batch of every batch weighs by its share of the group's examples, so the
    gradient equals one batch as large as the group for a mean-reduced loss; under DDP
    gradients are all-reduced once, on the last backward, and each rank's weighs by its
    share of every rank's examples (the non-finite check's all-reduce, done before that
    backward, brings their number): a step whose ranks hold batches of different sizes (a
    last, smaller batch) equals one batch of them all joined, as a step of equal ones does.

    Returns:
        the group's loss (a float when the non-finite check read it back — under DDP, the
        mean over every rank's examples — else a tensor on the device), its examples (under
        DDP with the check, every rank's together), and whether the optimizer stepped
        (False: skipped for a non-finite loss, or gradients' norm under clip_grad_norm).
        ``run.terms`` becomes the group's terms of a loss function's dict (``loss_terms.py``),
        weighed as the loss is — over the ranks with it — for ``StepEnd.terms``.

    Raises:
        NonFiniteError: the loss is NaN or infinite under ``Options(nonfinite="raise")``.
    """
    wrapped, opt, device, autocast, scaler = (
        run.wrapped,
        run.opt,
        run.device,
        run.autocast,
        run.scaler,
    )
    opt.zero_grad(set_to_none=True)
    k = trainer.micro_batches
    policy = trainer.options.nonfinite
    checked = run.world > 1 and policy != "ignore"  # the ranks' all-reduce, before backward
    ranks: tuple[bool, float, int, Terms] = (False, 0.0, 0, {})
    odd: Terms | None = None  # a loss call's terms, when not the fit's (under DDP: told after)
    if k == 1 and len(group) == 1:  # the common case, without bookkeeping
        x, y = trainer._split(group[0])
        if type(x) is not torch.Tensor:
            check_batch(x, group[0])
        x, y = to_device(x, device), to_device(y, device)
        n = num_examples(x)
        if autocast is contextlib.nullcontext:  # full precision: no context to enter
            loss, terms = loss_terms(trainer.loss, wrapped(x), y)
        else:
            with autocast():
                loss, terms = loss_terms(trainer.loss, wrapped(x), y)
        run.reported = [(fit_metrics(run.net), n)]  # (read before any other call of the net)
        if terms or run.term_names is not NO_TERMS:  # (the fit's names: term_names.py)
            odd = terms if term_names.check(run, terms, defer=checked) else None
        total = loss.detach()  # the history is made float32 when it is read back
        if checked:
            ranks = _over_ranks(total, n, run, terms, odd)
            loss = _weighed(loss, n, ranks[2], run.world)
        (loss if scaler is None else scaler.scale(loss)).backward()
    else:
        parts: list[tuple[Any, Any]] = []
        for batch in group:
            x, y = trainer._split(batch)
            if type(x) is not torch.Tensor:
                check_batch(x, batch)
            x, y = to_device(x, device), to_device(y, device)
            xs = chunk(x, k) if k > 1 else [x]
            ys = (chunk(y, k) if k > 1 else [y]) if y is not None else [None] * len(xs)
            parts.extend(zip(xs, ys, strict=True))
        sizes = [num_examples(xc) for xc, _ in parts]
        n = sum(sizes)
        total = torch.zeros((), device=device)
        terms = {}
        run.reported = []
        for i, ((xc, yc), size) in enumerate(zip(parts, sizes)):
            share = size / n  # each part weighs by its size: exact for mean losses
            last = i == len(parts) - 1
            sync = run.world == 1 or last  # all-reduce gradients once, at the end
            with contextlib.nullcontext() if sync else wrapped.no_sync():  # type: ignore[operator]
                with autocast():
                    out = wrapped(xc)
                    run.reported.append((fit_metrics(run.net), size))
                    loss, part_terms = loss_terms(trainer.loss, out, yc)
                    named = part_terms or run.term_names is not NO_TERMS  # (term_names.py)
                    if named and term_names.check(run, part_terms, defer=checked) and odd is None:
                        odd = part_terms  # (told every rank in the all-reduce: _over_ranks)
                    if i == 0 and k > 1 and run.state.step == 0:  # a sum? (reduction.py)
                        check_summed_value(trainer.loss, out, yc, loss, k)
                    del out  # (held no longer than before: a chunk's logits may be large)
                weighted = loss * share
                total += loss.detach().float() * share
                if part_terms:
                    add_weighed(terms, part_terms, share)
                if checked and last:  # the ranks' examples, before the all-reducing backward
                    ranks = _over_ranks(total, n, run, terms, odd)
                    weighted = _weighed(weighted, n, ranks[2], run.world, run.params)
                (weighted if scaler is None else scaler.scale(weighted)).backward()
    run.terms = ranks[3] if checked else terms
    if policy != "ignore" and run.world == 1:  # read back now: the history takes the float
        value = total.item()
        if not math.isfinite(value):
            _nonfinite(trainer, run, policy, value, index, group)
            opt.zero_grad(set_to_none=True)
            return value, n, False
        return value, n, _update(trainer, run, opt, value, index, group)
    if checked:  # under DDP: the check's all-reduce brought the ranks' loss too
        bad, mean, examples, _ = ranks
        if bad:
            _nonfinite(trainer, run, policy, float(total), index, group)
            opt.zero_grad(set_to_none=True)
            return total, n, False
        return mean, examples, _update(trainer, run, opt, mean, index, group)
    return total, n, _update(trainer, run, opt, math.nan, index, group)


def _nonfinite(
    trainer: Trainer,
    run: ActiveRun,
    policy: str,
    value: float,
    index: int,
    group: Sequence[Any] | None = None,
    norm: float | None = None,
) -> None:
    """Raise under the "raise" policy (under "skip" the caller skips the step).

    ``group``: the step's batches, ``index`` the epoch index of its last; without it
    (the fast path) the batch is looked up in a sequence of batches. Only here, once a
    loss is known to be non-finite, is a batch's size looked at: a batch of 0 examples
    (whose mean loss is NaN) is named as such, and the steps that go well pay nothing.
    ``norm``: the loss was finite, but the gradients' norm (clipping's) is this.
    """
    if policy == "raise":
        s = run.state
        if norm is not None:
            raise NonFiniteError(
                f"the gradients' norm is {norm} at step {s.step + 1} (epoch {s.epoch}, batch "
                f"{index} of the epoch), though the loss is finite ({value}); nothing was "
                "stepped or checkpointed with it. Look for an operation whose gradient "
                "overflows where its value does not (sqrt or pow at 0, log near 0, an "
                "inf masked out of the loss), or skip such steps with Options(nonfinite='skip')"
            )
        batches = group if group is not None else _batch(trainer, run, index)
        for j, batch in enumerate(batches or ()):
            if num_examples(trainer._split(batch)[0]) == 0:
                at = index - len(batches or ()) + 1 + j
                where = _position(run.train, batch)
                raise SettingError(
                    f"batch {at} of epoch {s.epoch}{where} has 0 examples (its input's first "
                    f"tensor has 0 rows), so its mean loss is {value}; drop "
                    "empty batches from the training data (a client or shard with no "
                    "examples has nothing to train on: skip its fit)"
                )
        if math.isfinite(value):  # (under DDP: another rank's was not)
            raise NonFiniteError(
                f"the loss of another rank is NaN or inf at step {s.step + 1} (epoch "
                f"{s.epoch}); this rank's (rank {run.rank}, batch {index} of the epoch) is "
                f"{value}. Nothing was stepped or checkpointed with it; the rank whose loss "
                "it was names its batch. Look for a too-high learning rate or bad data, "
                "or skip such steps with Options(nonfinite='skip')"
            )
        raise NonFiniteError(
            f"the loss is {value} at step {s.step + 1} (epoch {s.epoch}, batch "
            f"{index} of the epoch); nothing was stepped or checkpointed with it. Look for "
            "a too-high learning rate or bad data (a batch of 0 examples has a NaN mean "
            "loss), clip gradients (Options(clip_grad_norm=...)),"
            " or skip such steps with Options(nonfinite='skip')"
        )


def _batch(trainer: Trainer, run: ActiveRun, index: int) -> list[Any] | None:
    """Batch ``index`` of this epoch, when the training data is a sequence (else None)."""
    if not isinstance(run.train, Sequence):
        return None  # a DataLoader or a generator: reading it again may not give it back
    s, o = run.state, trainer.options
    order = epoch_batches(run.train, s.epoch, trainer.seed, o.shuffle, run.rank, run.world)
    return list(itertools.islice(order, index, index + 1))


def _position(data: Any, batch: Any) -> str:
    """`` (train[i])``: where ``batch`` is in a sequence of batches (the epoch shuffles it)."""
    if isinstance(data, Sequence):
        for i, b in enumerate(data):
            if b is batch:
                return f" (train[{i}])"
    return ""


def clipped(run: ActiveRun, clip: float, policy: str) -> float | None:
    """Clip the gradients to the norm ``clip``; their norm when it is NaN or inf and the
    non-finite policy checks (read back: clipping computed it anyway), else None."""
    norm = nn.utils.clip_grad_norm_(run.params, clip)
    if policy == "ignore":
        return None
    value = float(norm)
    return None if math.isfinite(value) else value


def _update(
    trainer: Trainer,
    run: ActiveRun,
    opt: torch.optim.Optimizer,
    loss: float,
    index: int,
    group: Sequence[Any],
) -> bool:
    """Clip by norm or by value (unscaled, under fp16) and step the optimizer (through the
    scaler under fp16). False: not stepped, the gradients' norm being non-finite under
    ``nonfinite="skip"`` (``"raise"`` raises; under fp16 the scaler skips such a step
    itself). Clipping by value reads nothing back: it checks no gradient.

    ``run.grad_norm`` becomes the gradients' norm before clipping, for ``StepEnd``: the one
    clipping by norm computes (a float when the non-finite check read it back, else a
    tensor, read when the watchers are told), or under ``Options(log_grad_norm=True)``, with
    watchers, one pass of its own; else None."""
    scaler, o = run.scaler, trainer.options
    clip, by_value = o.clip_grad_norm, o.clip_grad_value
    told = o.log_grad_norm and bool(run.watchers)  # (without watchers nobody reads it)
    norm: torch.Tensor | float | None = None
    if scaler is None:
        if clip is not None:
            norm = nn.utils.clip_grad_norm_(run.params, clip)
            if o.nonfinite != "ignore":  # read back (the check): the watchers take the float
                norm = float(norm)
                if not math.isfinite(norm):
                    _nonfinite(trainer, run, o.nonfinite, loss, index, group, norm=norm)
                    opt.zero_grad(set_to_none=True)
                    return False
        else:
            if told:
                norm = grad_norm(run.params)
            if by_value is not None:
                nn.utils.clip_grad_value_(run.params, by_value)
        opt.step()
    else:
        if clip is not None or by_value is not None or told:
            scaler.unscale_(opt)  # clip (and measure) the true gradients, not the scaled ones
            if clip is not None:
                norm = nn.utils.clip_grad_norm_(run.params, clip)
            else:
                if told:
                    norm = grad_norm(run.params)
                if by_value is not None:  # (unscale_ found any overflow before the clamp)
                    nn.utils.clip_grad_value_(run.params, by_value)
        scaler.step(opt)  # skipped by the scaler itself when a gradient overflowed
        scaler.update()
    run.grad_norm = norm
    return True


def grad_norm(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """The gradients' total L2 norm as ``clip_grad_norm_`` computes it, the gradients left
    as they are (``clip_grad_norm_(params, inf)`` would multiply each by 1): torch's
    ``get_total_norm`` (2.6 on), else the norm of the per-gradient norms."""
    grads = [p.grad for p in params if p.grad is not None]
    total = getattr(nn.utils, "get_total_norm", None)
    if total is not None:
        return total(grads)  # type: ignore[no-any-return]
    if not grads:
        return torch.zeros(())
    device = grads[0].device
    norms = [torch.linalg.vector_norm(g).to(device) for g in grads]
    norm: torch.Tensor = torch.linalg.vector_norm(torch.stack(norms))
    return norm


def _over_ranks(
    loss: torch.Tensor, n: int, run: ActiveRun, terms: Terms, odd: Terms | None
) -> tuple[bool, float, int, Terms]:
    """Under DDP, in one all-reduce: whether the loss is non-finite on any rank (they all
    skip, or none does), the ranks' loss — each rank's weighed by its examples, the mean
    loss of their batches joined (in float32) — and their examples together, for the
    gradients' weights, the history and the watchers; and each of the loss's ``terms``
    over the ranks as the loss, by the fit's names (``run.term_names``, the same on every
    rank: ``term_names.py``). ``odd``: this rank's loss gave other names in this step
    (those): said in the all-reduce, so that every rank raises here, together.

    Raises:
        SettingError: a rank's loss gave other terms in this step than the fit's.
    """
    value = loss.item()
    finite = math.isfinite(value)
    names = run.term_names or ()
    sums = [float(terms[k]) * n if k in terms else 0.0 for k in names]
    local = torch.tensor(
        [0.0 if finite else 1.0, value * n if finite else 0.0, n, odd is not None, *sums],
        device=loss.device,
    )
    bad, total, examples, changed, *summed = ddp.total(local)
    if changed:
        step = run.state.step + 1
        if odd is not None:
            raise SettingError(term_names.changed(names, odd, step))
        raise SettingError(term_names.other_rank_changed(names, step, run.rank))
    over = examples if examples > 0 else run.world
    means = {k: float(t / over) for k, t in zip(names, summed, strict=True)}
    return bool(bad), float(total / over), int(examples), means


def _weighed(
    loss: torch.Tensor, n: int, examples: int, world: int, params: Sequence[Any] = ()
) -> torch.Tensor:
    """``loss`` weighed by this rank's share of every rank's ``examples``: DDP averages the
    ranks' gradients, so a rank with ``n`` of them weighs ``world * n / examples`` for the
    step to equal one batch of every rank's examples. The gradients ``params`` already
    hold (micro-batches before the last, accumulated without an all-reduce) are weighed
    alike. Ranks with batches of one size weigh 1: nothing is touched."""
    factor = world * n / examples if examples > 0 else 1.0
    if factor == 1.0:
        return loss
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.grad.mul_(factor)
    return loss * factor
