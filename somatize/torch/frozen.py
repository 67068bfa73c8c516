"""The frozen-node runtime: what ``g.freeze(node)`` means when a frozen node runs.

A frozen node (a subgraph node too) runs its modules in eval mode — put back in it at every
call — and sees ``ctx.training`` False. It runs under ``torch.no_grad()`` unless its input
requires grad: fed by a trainable node, it runs with grad on (its own parameters frozen all
the same), so gradients pass through it to the nodes before it, as they pass through a
PyTorch layer whose parameters have ``requires_grad=False``. ``module(g)`` installs it
(``equip``); its parameters are frozen there.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import CacheError, NodeError, ValueConversionError
from ..graph import Graph
from ..node import Ctx, Done
from ..values import Opaque
from .codecs import NdarrayCodec, TensorCodec
from .draws import Drawing, drawn
from .holdings import _PLAIN, Holdings, held_by

__all__ = ["equip", "needs_grad"]

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


class _FrozenWrap:
    """The graph's runtime wrap: a frozen node's forward runs in eval mode, and without grad
    unless its input requires grad (then gradients pass through it, as in PyTorch); a
    cached node's is watched for random draws (``draws.py``); ``draws`` tells the keyed walk
    whether a node whose key feeds a cached node's drew (it is then keyed by its output).

    Classes, not closures, so that a graph and its module stay picklable
    (``torch.save(model)``, ``copy``, a worker's task). It holds its graph weakly: the graph
    holds it, and a strong reference back would make a cycle only the cyclic collector
    frees — and with it the graph's weights, a sweep's fresh graph per run."""

    def __init__(self, g: Graph) -> None:
        self._graph = weakref.ref(g)

    @property
    def _somatize_graph(self) -> Graph | None:
        """Which graph it was made for (None once that graph is gone)."""
        return self._graph()

    def __getstate__(self) -> dict[str, Any]:  # (a weak reference does not pickle)
        return {"graph": self._graph()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._graph = weakref.ref(state["graph"])

    def __call__(
        self, node_id: str, impl: Any, forward: Callable[[Any, Ctx], Done]
    ) -> Callable[[Any, Ctx], Done]:
        g = self._graph()
        assert g is not None  # (called as its graph builds its program)
        memory = g.memory
        if node_id in memory.per_example:
            _rows_alone(node_id, impl)
        if node_id in memory.frozen:
            forward = _Frozen(node_id, impl, forward)
        if node_id in memory.cached:  # (it runs on a miss only: its draws would be kept)
            forward = Drawing(node_id, impl, forward)
        return forward

    draws = staticmethod(drawn)


def _rows_alone(node_id: str, impl: Any) -> None:
    """Refuse a node cached per example that holds a batch norm without running statistics
    (``track_running_stats=False``): it normalises with its batch's statistics in eval mode
    too, so a row's output depends on the rows beside it."""
    if isinstance(impl, Graph):
        for inner in impl._impls.values():
            _rows_alone(node_id, inner)
        return
    for name, value in vars(impl).items():
        if isinstance(value, nn.Module):
            held: nn.Module | None = value
        elif type(value) in _PLAIN or isinstance(value, torch.Tensor) or name[:9] == "_somatize":
            continue
        else:
            held = held_by(value, node_id)
            name = ""
        for inner_name, m in held.named_modules() if held is not None else ():
            if isinstance(m, _BatchNorm) and m.running_mean is None and m.running_var is None:
                at = ".".join(p for p in (name, inner_name) if p)
                raise CacheError(
                    f"node {node_id!r} is cached per example but holds {type(m).__qualname__} "
                    f"{at!r} with track_running_stats=False, which normalises with its batch's "
                    "statistics in eval mode too: a row's output depends on the rows beside it, "
                    f"so a row cached in one batch would be served in another — cache "
                    f"{node_id!r} per batch (g.cache({node_id!r})), or give the batch norm "
                    "running statistics"
                )


class _Frozen:
    """A frozen node's forward (see ``_FrozenWrap``)."""

    __slots__ = ("forward", "impl", "node_id")

    def __init__(self, node_id: str, impl: Any, forward: Callable[[Any, Ctx], Done]) -> None:
        self.node_id, self.impl, self.forward = node_id, impl, forward

    def prepare(self) -> None:
        """Before its key is read: its modules in eval mode, the mode its forward runs in,
        so a module put in training mode (a submodule swapped in, ``.train()`` on the
        node's own) is keyed as it computes, and its entry is not found again once the
        node is unfrozen and trains."""
        _keep_eval(self.node_id, self.impl)

    def __call__(self, x: Any, ctx: Ctx) -> Done:
        _keep_eval(self.node_id, self.impl)
        run = ctx.run
        if run.training:  # its modules run in eval mode: so does what reads ctx.training
            ctx = Ctx(ctx.node, ctx.device, run._replace(training=False))
        # torch.no_grad() as a context costs a few µs per call; the switch it flips, not
        if not _grad_enabled():
            return self.forward(x, ctx)
        if needs_grad(x):  # fed by a trainable node: its gradients pass through this one
            return _passing(self.node_id, self.forward(x, ctx))
        _set_grad_enabled(False)
        try:
            return self.forward(x, ctx)
        finally:
            _set_grad_enabled(True)


def needs_grad(x: Any) -> bool:
    """Whether ``x`` — a tensor, or a tuple, list or dict of them (one level) — requires grad."""
    if isinstance(x, torch.Tensor):
        return x.requires_grad
    t = type(x)
    items = x if t is tuple or t is list else x.values() if t is dict else ()
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in items)


def _passing(node_id: str, done: Done) -> Done:
    """What a frozen node fed by a trainable one returned: its output carries gradients, so
    returned as data (not Opaque) it is refused with the reason."""
    if type(done) is Done and type(done.value) is not Opaque and needs_grad(done.value):
        raise ValueConversionError(
            f"node {node_id!r} is frozen, but its input requires grad (a trainable node before "
            "it), so its output carries gradients through it to that node: return "
            "Done(Opaque(...)); to train nothing before it, freeze those nodes too or pass "
            "it x.detach()"
        )
    return done


def _keep_eval(node_id: str, impl: Any) -> None:
    """A frozen node runs its modules in eval mode, at every call: also those put back in
    training mode since ``module(g)`` applied the freeze — by ``.train()`` on the node's
    own module, a submodule swapped in, a module made before the freeze — so a dropout
    mask or batch statistics are never computed, nor remembered by a cached node (but a
    batch norm without running statistics uses the batch's: see ``_rows_alone``). (One
    walk of its modules: little beside the forward it precedes.) A frozen subgraph: every
    node inside it."""
    if isinstance(impl, Graph):
        for inner_id, inner in impl._impls.items():
            _keep_eval(inner_id, inner)
        return
    for name, value in vars(impl).items():
        if isinstance(value, nn.Module):  # (the common case: no container to make)
            if _training(value):
                _eval(node_id, name, value)
        elif not (
            type(value) in _PLAIN
            or isinstance(value, torch.Tensor)
            or name.startswith("_somatize")  # (what node_holdings skips)
        ):
            held = held_by(value, f"{node_id}.{name}")  # (containers, held nodes: new boxes)
            if held is not None and any(
                m.training for m in held.modules() if type(m) not in (Holdings, nn.Module)
            ):
                _eval(node_id, name, held)


def _eval(node_id: str, name: str, module: nn.Module) -> None:
    """``module.eval()`` for frozen node ``node_id`` (``name``: what holds it), a module
    whose mode cannot change (torch.export's) refused naming the node and the fix.

    Raises:
        NodeError: a module under it refused ``train``/``eval`` with NotImplementedError.
    """
    try:
        module.eval()
    except NotImplementedError as e:
        raise _fixed_mode(node_id, name, module, e) from e


def _refusing(name: str, module: nn.Module, call: str) -> tuple[str, str]:
    """(where, what) of the module under ``module`` whose ``call`` (``"eval()"``) raises."""
    # torch.export's module (ExportedProgram.module()) replaces train and eval on the
    # instance with methods that raise: its dropout and batch norm run as when exported
    path, refusing = name, module
    for inner, m in module.named_modules():
        if "train" in vars(m) or "eval" in vars(m):
            path, refusing = ".".join(p for p in (name, inner) if p), m
            break
    if isinstance(refusing, torch.fx.GraphModule):
        return path, (
            "a module made by torch.export (ExportedProgram.module()): its mode was fixed "
            f"when it was exported, and its {call} raises"
        )
    return path, f"a {type(refusing).__qualname__} whose {call} raises"


def _fixed_mode(node_id: str, name: str, module: nn.Module, e: NotImplementedError) -> NodeError:
    path, what = _refusing(name, module, "eval()")
    return NodeError(
        f"node {node_id!r} is frozen, so its modules run in eval mode, but {path!r} is "
        f"{what} ({type(e).__name__}: {e}). Freeze the nn.Module it was made from instead; "
        "or export that model in eval mode (torch.export.export(model.eval(), args)) and "
        "hold the result in an nn.Module whose train(mode) sets only its own self.training"
    )


def mode_refused(net: nn.Module, mode: bool, e: NotImplementedError) -> Exception:
    """The error for ``module(g).train(mode)`` refused by a module a node holds (an
    exported one, see ``_fixed_mode``), naming the node; ``e`` itself where none is found."""
    call = "train()" if mode else "eval()"
    for node_id, holder in net.named_children():
        for _, m in holder.named_modules():
            if "train" in vars(m) or "eval" in vars(m):
                path, what = _refusing("", holder, call)
                return NodeError(
                    f"module(g).{call} reaches node {node_id!r}, but {path!r} in it is "
                    f"{what} ({type(e).__name__}: {e}); a fit puts the model in training "
                    "mode, an evaluation in eval mode. Hold the nn.Module it was made from "
                    "instead; or hold the exported module in an nn.Module whose "
                    "train(mode) sets only its own self.training (its dropout and batch "
                    "norm then run as exported: export in eval mode, "
                    "torch.export.export(model.eval(), args), to run without them)"
                )
    return e


def _training(module: nn.Module) -> bool:
    """Whether ``module`` or a module under it is in training mode: ``any(m.training for m
    in module.modules())`` by a loop over the children tables, without the nested
    generators of ``named_modules`` (a frozen node's modules are read at every batch)."""
    todo, seen = [module], set()
    pop, push = todo.pop, todo.extend
    while todo:
        m = pop()
        if m.training:
            return True
        children = m._modules
        if children and id(m) not in seen:  # (a module reached twice: read once)
            seen.add(id(m))
            push([c for c in children.values() if c is not None])
    return False


def equip(g: Graph) -> Graph:
    """Give a graph (and its subgraphs) the torch codecs and the frozen-node runtime, and
    put its frozen nodes' modules in eval mode.

    Raises:
        NodeError: a frozen node holds a module whose mode cannot change (torch.export's).
    """
    made_for = getattr(g.wrap, "_somatize_graph", None)
    if not any(isinstance(c, TensorCodec) for c in g.codecs):
        g.use(codecs=(*g.codecs, TensorCodec(), NdarrayCodec()), wrap=_FrozenWrap(g))
    elif g.wrap is None or (made_for is not None and made_for is not g):
        # A deep copy of an equipped graph: its runtime (and the program built with it)
        # still call the original's nodes. Remaking the runtime rebuilds the program.
        g.use(wrap=_FrozenWrap(g))
    for c in g.codecs:  # (what modules hold is read with the graph's codecs, numpy's too)
        if isinstance(c, TensorCodec):
            c.join(g.codecs)
    for node_id in g.memory.frozen:  # now, not at its first call: what cannot be put in
        _keep_eval(node_id, g[node_id])  # eval mode is refused when module(g) is made
    for sub in g._subgraphs().values():
        equip(sub)
    return g
