"""What the Trainer checks on a run's first optimizer step, so that no later step pays.

* **Gradient reach.** When the optimizer first steps, every trainable parameter should
  have a gradient. One without any belongs to a node whose output the loss does not
  depend on: a node returning ``self.lin(x).detach()``, a loss that ignores the output,
  a branch never taken. Such parameters never train; a warning names their nodes.
* **A first step that fails** (before the optimizer ever stepped) with a ``TypeError`` or
  ``ValueError`` gets a note explaining the batch rule when the batch was not split the
  way the caller probably meant (``(x, y, w)``, ``{"image", "label"}``, ``fit((X, Y))``,
  a pair fed whole without ``loss=``), and a loss that does not require grad (an integer
  tensor, one computed under ``no_grad``) gets a note naming the loss.

The check is an optimizer step pre-hook, removed when the fit ends; after the first step
it returns at once (one Python call a step, a fraction of a µs, against the plain loop of
``benchmarks/bench_training.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import SettingError, add_note
from ..stack import outside
from .batch_of_one import note_batch_of_one
from .compile_errors import traced_node_note

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["batch_note", "describe", "evaluate_note", "first_step", "keywords_note", "loss_note"]


@contextlib.contextmanager
def first_step(trainer: Trainer, run: ActiveRun, train: Any) -> Iterator[None]:
    """Around a run's loop: check gradient reach at the first optimizer step, and explain
    a failure that comes before it."""
    opt = run.opt
    stepped = False

    def check(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        nonlocal stepped
        if stepped:  # (a hook cannot remove itself while torch iterates over the hooks)
            return
        stepped = True
        warn_unreached(run.net, run.params)

    handle = opt.register_step_pre_hook(check)
    try:
        yield
    except (TypeError, ValueError, RuntimeError) as e:
        if not stepped:
            explain(e, trainer, train)
            keywords_note(e, trainer, run.net)
            dtype_note(e, trainer, run.net)
        note_batch_of_one(e, trainer, run)  # (any step: a short last batch, batch_of_one.py)
        if run.compiled:  # (dynamo's errors are RuntimeErrors: any step may recompile)
            traced_node_note(e, run.net)
        raise
    finally:
        handle.remove()


def warn_unreached(net: nn.Module, params: Sequence[nn.Parameter]) -> None:
    """Warn, naming their nodes, about trainable parameters the first backward did not reach."""
    if all(p.grad is not None for p in params):  # (the common case: no walk for names)
        return
    trained = {id(p) for p in params}
    missing = [n for n, p in net.named_parameters() if id(p) in trained and p.grad is None]
    if not missing:
        return
    from .module import GraphModule

    by: dict[str, list[str]] = {}
    for name in missing:
        owner = name.split(".", 1)[0] if isinstance(net, GraphModule) else name.rpartition(".")[0]
        by.setdefault(owner, []).append(name)
    shown = "; ".join(
        f"{'node' if isinstance(net, GraphModule) else 'module'} {owner!r} "
        f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        for owner, names in by.items()
    )
    warnings.warn(
        f"{len(missing)} trainable parameters got no gradient from the first step, so "
        f"they will never train: {shown}. The loss does not depend on them — a node's "
        "output detached (.detach()) or unused, or a loss that ignores the output. Return "
        "the output un-detached (Done(Opaque(out))) to train them, or freeze the node "
        "(g.freeze(...)) / set requires_grad_(False) if they are meant to stay",
        UserWarning,
        stacklevel=outside(),
    )


def explain(e: BaseException, trainer: Trainer, train: Any) -> None:
    """Add a note to a first step's failure: the batch rule, or the loss without grad."""
    if isinstance(e, RuntimeError) and "does not require grad" in str(e):
        name = getattr(trainer.loss, "__qualname__", type(trainer.loss).__qualname__)
        what = f"the loss function {name}" if trainer.loss is not None else "the graph"
        add_note(
            e,
            f"{what} returned a loss that does not require grad, so backward() has nothing "
            "to differentiate: an integer tensor (a count, argmax, an accuracy), a value "
            "computed under torch.no_grad() or from .item()/.detach(), or a model whose "
            "output is detached. Return a float tensor computed from the model's output "
            "(e.g. loss=F.cross_entropy); a metric belongs in Trainer(metrics=...)",
        )
        return
    said = loss_note(e, trainer.loss)
    if said is not None:
        add_note(e, said)
    if isinstance(e, (RuntimeError, SettingError)):  # (a SettingError names its own fix)
        return
    batch = _failing_batch(e)
    if batch is None:
        return
    if trainer.split is not None:  # the user's own split: the batch rule does not apply
        return
    note = batch_note(batch, trainer.loss is not None) + _train_hint(train)
    if note:
        add_note(e, note)


def keywords_note(e: BaseException, trainer: Trainer, net: nn.Module, batch: Any = None) -> None:
    """A note on a failure where the model's input is a dict whose keys its ``forward``
    names as parameters (a Hugging Face model's ``forward(input_ids, attention_mask)``): the
    Trainer calls ``model(inputs)``, one argument, never ``model(**inputs)``. ``batch``: the
    failing batch, where the failing frames do not hold it (``predict``)."""
    if not isinstance(e, (TypeError, ValueError, AttributeError)):
        return
    batch = _failing_batch(e) if batch is None else batch
    try:
        x = trainer._split(batch)[0] if batch is not None else None
        params = inspect.signature(net.forward).parameters
    except Exception:  # (the split's own failure is told by explain; no signature: no note)
        return
    if not isinstance(x, Mapping):
        return
    named = [k for k in x if k in params]
    if not named:
        return
    add_note(
        e,
        f"the model's input is a dict ({', '.join(map(repr, x))}) and its forward takes "
        f"{', '.join(named)} as parameters, but the Trainer calls model(inputs) with one "
        "argument, not model(**inputs): the whole dict went to its first parameter. Wrap "
        "the model: class Wrapped(nn.Module): def __init__(self, m): super().__init__(); "
        "self.m = m; def forward(self, inputs): return self.m(**inputs).logits (or the "
        "output the loss wants)",
    )


# what torch says of mixed float dtypes (matmul, conv, an elementwise op with out=)
_MIXED = ("must have the same dtype", "expected scalar type", "and weight type", "same dtype")


def dtype_note(e: BaseException, trainer: Trainer, net: nn.Module) -> None:
    """A note on a first step failing on mixed float dtypes, where the model's parameters
    are of one and the batch's input tensors of another (a float64 model, float32 data):
    the Trainer moves a batch to the device but never casts it."""
    if not isinstance(e, RuntimeError) or not any(m in str(e) for m in _MIXED):
        return
    model = next((p.dtype for p in net.parameters() if p.is_floating_point()), None)
    batch = _failing_batch(e)
    try:
        x = trainer._split(batch)[0] if batch is not None else None
    except Exception:  # (the split's own failure is told by explain)
        return
    leaves = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else [x]
    data = {t.dtype for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if model is None or not data or data == {model}:
        return
    said = ", ".join(sorted(str(d).removeprefix("torch.") for d in data))
    name = str(model).removeprefix("torch.")
    add_note(
        e,
        f"the model's parameters are {name} and the batch's inputs {said}: the Trainer moves "
        "a batch to the device but never casts it. Make them one dtype — the data "
        f"(x.to(torch.{name}) in the Dataset or a collate_fn), or the model "
        f"(model.to(torch.{said.split(', ')[0]})); for mixed precision use "
        "Options(precision='bf16'), which autocasts",
    )


def loss_note(e: BaseException, loss: Any, who: str = "the Trainer") -> str | None:
    """The note on ``e`` when it was raised in calling ``loss``: how it was called, with
    the output's and target's structure (a tuple output, a float target...); else None."""
    called = _loss_call(e) if loss is not None else None
    if called is None:
        return None
    output, target = called
    name = getattr(loss, "__qualname__", type(loss).__qualname__)
    args = "output" if target is None else "output, target"
    given = f"output {_typed(output)}" + ("" if target is None else f", target {_typed(target)}")
    return (
        f"raised in the loss function {name}, called as loss({args}) with {given}: "
        f"{who} calls it with the model's output and the batch's target (the "
        "output alone for batches without a target); F.cross_entropy, for one, wants "
        "float logits (batch, classes) and int64 class indices (batch,)"
    )


def evaluate_note(e: BaseException, trainer: Trainer, data: Any = None) -> None:
    """The batch rule's note (``batch_note``) on a ``TypeError``/``ValueError`` raised in
    ``Trainer.evaluate`` (or on ``fit``'s validation) on a batch it did not split, as
    ``fit`` adds on its first step; ``data``: what was evaluated, for ``val=(X, Y)``."""
    if trainer.split is not None or not isinstance(e, (TypeError, ValueError)):
        return
    batch = _failing_batch(e)
    if batch is None:
        return
    note = batch_note(batch, trainer.loss is not None)
    if note and _tensor_pair(data):
        note += (
            "; the data evaluated is a pair (X, Y) (val=(X, Y) or evaluate(g, (X, Y))), which "
            "is a sequence of two batches, X and Y: pass [(X, Y)] for one batch, or "
            "DataLoader(TensorDataset(X, Y), batch_size=32)"
        )
    if note:
        add_note(e, note)


def _typed(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} {tuple(value.shape)}"
    return describe(value, 1)


def _loss_call(e: BaseException) -> tuple[Any, Any] | None:
    """(output, target) when ``e`` was raised in calling the loss function (``loss_terms``'s
    call of it, or the fast path's, or inside it), else None."""
    from .fastpath import fast_epoch
    from .loss_terms import loss_terms, scalar_and_terms

    tb: types.TracebackType | None = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code is fast_epoch.__code__:
            local = tb.tb_frame.f_locals
            # the model ran (out) and the loss was not made yet: the first batch's
            # loss call failed (after a first step, explain is not asked)
            if "out" in local and "loss" not in local:
                return local["out"], local.get("y")
        if code is loss_terms.__code__:
            local = tb.tb_frame.f_locals
            # (its own check of what the loss returned says what it wants: no note on it)
            after = tb.tb_next
            if after is not None and after.tb_frame.f_code is scalar_and_terms.__code__:
                return None
            return local.get("output"), local.get("target")
        tb = tb.tb_next
    return None


def _failing_batch(e: BaseException) -> Any:
    """The batch the step was on, read from the failing frames of the step's code (the
    loops keep it in a local, so finding it costs the steps that go well nothing)."""
    from .fastpath import fast_epoch
    from .metrics import evaluate
    from .step import step

    tb: types.TracebackType | None = e.__traceback__
    while tb is not None:
        code, local = tb.tb_frame.f_code, tb.tb_frame.f_locals
        if (code is fast_epoch.__code__ or code is evaluate.__code__) and "batch" in local:
            return local["batch"]
        if code is step.__code__ and local.get("group"):
            return local["group"][0]
        tb = tb.tb_next
    return None


def batch_note(batch: Any, with_loss: bool, owner: str = "Trainer") -> str:
    """Why a step that failed on ``batch`` may have been given it in a form the ``owner``
    (``Trainer``, or ``LightningGraph``) does not split, and how to split it; "" when it
    was split (the failure is then the model's or the loss's own)."""
    shape = describe(batch)
    pair = isinstance(batch, (tuple, list)) and len(batch) == 2
    if not with_loss:
        if not pair and not (isinstance(batch, Mapping) and "x" in batch):
            return ""
        return (
            f"the batch is {shape}, and without loss= the graph gets the whole batch as its "
            "input and its output is the loss; pass loss=fn(output, target) (e.g. "
            "F.cross_entropy) to have (x, y) split, or make the graph take the pair"
        )
    if pair or (isinstance(batch, Mapping) and "x" in batch):
        return ""  # it was split: the failure is the model's or the loss's own
    fields = _field_names(batch)
    if isinstance(batch, Mapping):
        fix = _dict_fix(batch, owner)
    elif fields:  # a dataclass or namedtuple: split it by its fields' names
        target = next((f for f in _TARGETS if f in fields), fields[-1])
        first = next(f for f in fields if f != target)
        fix = (
            f"or say how to split it by its fields ({', '.join(fields)}): "
            f"{owner}(split=lambda b: (b.{first}, b.{target}))"
        )
    else:
        fix = (
            "e.g. TensorDataset(X, Y), ((x1, x2), y) for two inputs, or say how to split "
            f"it: {owner}(split=lambda b: ((b[0], b[1]), b[2]))"
        )
    return (
        f"the batch is {shape}, which the {owner} does not split: with a loss function a "
        "batch is (x, y) or a dict with 'x' (and 'y'); anything else is the model's input "
        "whole, and the loss is called as loss(output). Give batches that form, " + fix
    )


_TARGETS = ("labels", "label", "targets", "target", "y")  # what a dataset names its target


def _dict_fix(batch: Mapping[Any, Any], owner: str) -> str:
    """How to split a dict batch: its target key from the rest (a tokenizer's
    ``{"input_ids", "attention_mask", "labels"}``: the other keys as the model's input
    dict), or any two of its keys."""
    keys = list(batch)
    target = next((k for k in _TARGETS if k in batch), None)
    if target is not None and len(keys) > 2:
        return (
            f"or say how to split it: {owner}(split=lambda b: ({{k: v for k, v in b.items() "
            f"if k != {target!r}}}, b[{target!r}])): the model gets a dict of the other keys "
            f"({', '.join(repr(k) for k in keys if k != target)}), the loss b[{target!r}] as "
            "its target"
        )
    first = next((k for k in keys if k != target), keys[0] if keys else "...")
    second = f"b[{target!r}]" if target is not None else "b[...]"
    return (
        f"or say how to split it: {owner}(split=lambda b: (b[{first!r}], {second})) "
        f"with two of its keys ({', '.join(map(repr, keys))})"
    )


def _field_names(value: Any) -> list[str]:
    """The fields of a dataclass instance or a namedtuple (at least two), else []."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
    else:
        names = list(getattr(value, "_fields", ())) if isinstance(value, tuple) else []
    return names if len(names) > 1 else []


def _tensor_pair(data: Any) -> bool:
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and all(isinstance(t, torch.Tensor) for t in data)
    )


def _train_hint(train: Any) -> str:
    if _tensor_pair(train):
        return (
            "; fit() was given a pair (X, Y), which is a sequence of two batches, X and Y: "
            "pass [(X, Y)] for one batch, or DataLoader(TensorDataset(X, Y), batch_size=32)"
        )
    return ""


def describe(value: Any, depth: int = 0) -> str:
    """A short account of a batch's structure: ``a tuple of 3 (tensor (4, 3), ...)``."""
    if isinstance(value, torch.Tensor):
        return (
            f"a tensor of shape {tuple(value.shape)}"
            if depth == 0
            else f"tensor {tuple(value.shape)}"
        )
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k!r}: {describe(v, depth + 1)}" for k, v in list(value.items())[:6])
        return f"a dict {{{inner}}}" if depth == 0 else f"{{{inner}}}"
    if fields := _field_names(value):
        inner = ", ".join(f"{f}={describe(getattr(value, f), depth + 1)}" for f in fields[:6])
        more = ", ..." if len(fields) > 6 else ""
        return f"{'a ' if depth == 0 else ''}{type(value).__qualname__}({inner}{more})"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v, depth + 1) for v in value[:6])
        more = ", ..." if len(value) > 6 else ""
        kind = type(value).__name__
        return f"a {kind} of {len(value)} ({inner}{more})" if depth == 0 else f"({inner}{more})"
    return type(value).__qualname__
