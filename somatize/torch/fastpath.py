"""The Trainer's common case, one epoch with every call it does not need inlined.

One process, full precision, one batch per step, no micro-batches, no watchers: what
``loop._epoch`` + ``step.step`` do, written out flat, because every function call of a
step is measured against a plain PyTorch loop (``benchmarks/bench_training.py``). It
must stay equal to them — ``tests/torch/test_trainer*.py`` run both paths. A loss
function's dict of terms (``loss_terms.py``) trains on its ``"loss"``; its terms go into
the run's history (``TrainResult.terms``), as ``loop._epoch`` records them: without watchers
no ``StepEnd`` is made.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules import module as _torch_module  # (its global hooks)

from .batches import num_examples, split, to_device
from .evaluation import evaluate_into
from .held_rng import held_states, put_held
from .loss_terms import Terms, loss_terms, scalar_and_terms
from .policy import save
from .rng import put_back, snapshot
from .settings import check_batch
from .step import _nonfinite, clipped
from .term_names import NO_TERMS, check

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from .module import GraphModule
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["fast_epoch"]


def _zero_grad(opt: torch.optim.Optimizer) -> Any:
    """``opt.zero_grad`` — or, for an optimizer that keeps torch's, what it does with
    ``set_to_none=True`` (each gradient set to None) without its profiler scope and
    dynamo guard, a few µs a step."""
    if type(opt).zero_grad is not torch.optim.Optimizer.zero_grad:
        return opt.zero_grad
    params = [p for group in opt.param_groups for p in group["params"]]

    def zero_grad(set_to_none: bool = True) -> None:
        for p in params:
            p.grad = None

    return zero_grad


def _call(net: nn.Module) -> Any:
    """``net.forward`` when calling the module would only forward to it (no hooks, not
    compiled in place), else the module itself."""
    hooks = (
        net._forward_hooks,
        net._forward_pre_hooks,
        net._backward_hooks,
        net._backward_pre_hooks,
        _torch_module._global_forward_hooks,
        _torch_module._global_forward_pre_hooks,
        _torch_module._global_backward_hooks,
        _torch_module._global_backward_pre_hooks,
    )
    if any(hooks) or getattr(net, "_compiled_call_impl", None) is not None:
        return net
    if type(net).__call__ is not nn.Module.__call__:
        return net
    return net.forward


_Tensor = torch.Tensor


def fast_epoch(
    trainer: Trainer,
    run: ActiveRun,
    batches: Iterator[Any],
    val: Iterable[Any] | None,
    step_sched: Any,
    max_steps: int,
    graph_net: GraphModule | None,
) -> tuple[int, bool]:
    """One epoch's steps: (index of the last batch, whether the epoch ran to its end)."""
    s, net, opt, device = run.state, run.wrapped, run.opt, run.device
    loss_fn, with_loss, user_split = trainer.loss, trainer.loss is not None, trainer.split
    zero_grad, opt_step = _zero_grad(opt), opt.step
    call = _call(net)
    policy, clip = trainer.options.nonfinite, trainer.options.clip_grad_norm
    by_value = trainer.options.clip_grad_value
    every = trainer.options.eval_every_steps if val is not None else None
    ckpt_every = trainer.checkpoint.every_steps if trainer.checkpoint is not None else None
    losses, history = s.losses, s.terms
    no_terms: Terms = {}  # (a loss alone: its step records no terms)
    isfinite = math.isfinite
    deadline, monotonic, stop = run.deadline, time.monotonic, run.stop
    # GraphModule.step lives in the instance dict (module.py's _OWN): set it there directly
    own = graph_net.__dict__ if graph_net is not None else {}
    clock = own if "step" in own else None
    # the counters, kept in locals and written back before anything reads the state
    step, examples, start, i = s.step, s.examples_seen, s.position, -1
    # the epoch's loss (epoch_loss.py): its sum of loss * examples; its examples are
    # those it had plus the examples counted from here (written back with the counters)
    sums = s.epoch_loss
    total, counted, examples0 = sums.total, sums.examples, examples
    last = -1  # the last batch trained on (or skipped): the position is the one after it
    # The RNG states as the last step left them, when the run stops after it: the loop reads
    # one more batch to learn whether the epoch ended, and that read may draw (augmentation).
    stopped: tuple[Any, ...] | None = None
    # carried state a skipped step must not pass on (a NaN state would skip every step after)
    carried = run.carries if trainer.options.nonfinite == "skip" else ()
    names = run.term_names  # the loss's terms (term_names.py): NO_TERMS, none, once known
    kept: list[Any] = []
    # TrainResult.timing's "data": the waits for batches, between a step's end and the next
    perf, waited = time.perf_counter, 0.0
    tick = perf()
    try:
        for i, batch in enumerate(batches):
            waited += perf() - tick
            if i < start:  # resuming mid-epoch: these batches were already trained on
                tick = perf()
                continue
            if step >= max_steps or s.pruned or run.timed_out or run.stopped:
                if stopped is not None:
                    put_back(stopped[0])
                    put_held(run.held, stopped[1])
                return i, False
            if clock is not None:
                clock["step"] = step + 1  # nodes see the number of the step they compute
            elif graph_net is not None:
                graph_net.step = step + 1
            if not with_loss:
                x, y = batch, None
            elif user_split is not None:
                x, y = user_split(batch)
            elif type(batch) is tuple and len(batch) == 2:
                x, y = batch
            else:
                x, y = split(batch)
            if type(x) is _Tensor:
                if x.device != device:
                    x = x.to(device, non_blocking=True)
                n = len(x) if x.dim() else 1
            else:
                check_batch(x, batch)
                x = to_device(x, device)
                n = num_examples(x)
            if type(y) is _Tensor:
                if y.device != device:
                    y = y.to(device, non_blocking=True)
            elif y is not None:
                y = to_device(y, device)
            zero_grad(set_to_none=True)
            if carried:
                kept = [c.value for c in carried]
            out = call(x)
            terms = no_terms
            if with_loss and y is not None:
                loss = loss_fn(out, y)  # type: ignore[misc]
                # a dict of terms, or wrong; or any loss while the fit's terms are not known
                # to be none (term_names.py): its terms are checked, then recorded
                if type(loss) is not _Tensor or loss.dim() or names is not NO_TERMS:
                    s.step = step
                    loss, terms = scalar_and_terms(loss_fn, loss)
                    check(run, terms)
                    names = run.term_names
            else:
                loss, terms = loss_terms(loss_fn, out, y)
                if terms or names is not NO_TERMS:
                    s.step = step
                    check(run, terms)
                    names = run.term_names
            loss.backward()
            value = loss.item()  # the history's float, and the non-finite check's
            norm = None if clip is None or not isfinite(value) else clipped(run, clip, policy)
            if norm is not None or not isfinite(value):
                s.step, s.examples_seen = step, examples
                _nonfinite(trainer, run, policy, value, i, norm=norm)  # raises under "raise"
                zero_grad(set_to_none=True)
                for c, v in zip(carried, kept):  # the state as the step before left it
                    c.value = v
                s.skipped += 1
                last = i
                tick = perf()
                continue
            if by_value is not None:
                nn.utils.clip_grad_value_(run.params, by_value)
            opt_step()
            if step_sched is not None:
                step_sched.step()
            step += 1
            examples += n
            losses.append(value)
            total += value * n
            if terms or history:
                s.add_terms(terms, n)
            if own and (reported := own.get("metrics")):  # a node's metrics (epoch_metrics.py)
                s.metric_sums.add(reported, n)
            last = i
            if (every and step % every == 0) or run.due or (ckpt_every and step % ckpt_every == 0):
                s.step, s.examples_seen, s.position = step, examples, i + 1
                sums.total, sums.examples = total, counted + examples - examples0
                if every and step % every == 0:
                    evaluate_into(trainer, run)
                if (run.due or (ckpt_every and step % ckpt_every == 0)) and (
                    i + 1 != run.epoch_batches  # (the last batch: the epoch's end saves)
                ):
                    save(trainer, run)
            if deadline is not None and monotonic() >= deadline:  # (one process: world 1)
                run.timed_out = True
            if stop is not None and stop.received:  # Options(stop_on=): a signal came
                run.stopped = stop.stopped = stop.received
            if run.replay and (step >= max_steps or s.pruned or run.timed_out or run.stopped):
                # reading one more batch must not move what is saved
                stopped = snapshot(), held_states(run.held)
            tick = perf()
        waited += perf() - tick  # (the epoch's end: a DataLoader's workers shut down)
    finally:
        run.timing.data += waited
        s.step, s.examples_seen = step, examples
        sums.total, sums.examples = total, counted + examples - examples0
        if last >= 0:
            s.position = last + 1
    return i, True
