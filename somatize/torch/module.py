"""A graph is an ``nn.Module``: ``module(g)``, ``parameters(g)``, ``state(g)``, ``load_state(g, s)``.

Every ``nn.Module`` a node holds — as an attribute, or inside a list or dict
attribute — is registered under the node's id, so ``parameters()``,
``named_parameters()``, ``.to()``, ``.train()``/``.eval()``, ``state_dict()`` and
``load_state_dict()`` behave as for a hand-written module::

    model = module(g)                  # enc.emb.weight, classify.out.weight, ...
    opt = torch.optim.Adam(parameters(g), lr=1e-3)

Frozen nodes: parameters with ``requires_grad=False``, eval mode kept even when the
module is put in train mode, run under ``torch.no_grad()``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import StateError
from ..graph import Graph
from ..node import Ctx, Done
from ..values import Opaque
from .codecs import NdarrayCodec, TensorCodec

__all__ = ["GraphModule", "load_state", "module", "parameters", "state"]

_modules: weakref.WeakKeyDictionary[Graph, GraphModule] = weakref.WeakKeyDictionary()


class _Holdings(nn.Module):
    """The modules, parameters and tensors one node holds, registered under the node id."""

    def __init__(self, impl: Any) -> None:
        super().__init__()
        object.__setattr__(self, "_impl", impl)
        self._tensors: list[str] = []  # plain tensor attributes, written back after .to()
        for name, value in vars(impl).items():
            if name.startswith("_somatize"):
                continue
            if isinstance(value, nn.Module):
                self.add_module(name, value)
            elif isinstance(value, nn.Parameter):
                self.register_parameter(name, value)
            elif isinstance(value, torch.Tensor):
                self.register_buffer(name, value)
                self._tensors.append(name)
            elif isinstance(value, (list, tuple, dict)):
                items = value.items() if isinstance(value, dict) else enumerate(value)
                mods = {str(k): v for k, v in items if isinstance(v, nn.Module)}
                if mods:
                    box = nn.Module()
                    for k, m in mods.items():
                        box.add_module(k, m)
                    self.add_module(name, box)

    def _apply(self, fn: Any, recurse: bool = True) -> _Holdings:
        super()._apply(fn, recurse)
        for name in self._tensors:  # keep the node's own attribute pointing at the moved tensor
            setattr(self._impl, name, self._buffers[name])
        return self


@functools.cache
def _reserved() -> frozenset[str]:
    """Names a node id cannot take: attributes every GraphModule has."""
    return frozenset(dir(GraphModule))


class _Nodes(nn.Module):
    """The holdings of every node of a (sub)graph, by node id."""

    def __init__(self, g: Graph) -> None:
        super().__init__()
        for node_id in g.nodes():
            impl = g[node_id]
            if "." in node_id or node_id in _reserved():
                raise StateError(
                    f"node id {node_id!r} cannot name a module attribute "
                    "(no '.', and not a name nn.Module uses); rename the node"
                )
            held = _Nodes(impl) if isinstance(impl, Graph) else _Holdings(impl)
            if any(True for _ in held.parameters()) or any(True for _ in held.buffers()):
                self.add_module(node_id, held)


def _frozen_wrap(g: Graph) -> Callable[[str, Any, Callable[[Any, Ctx], Done]], Callable[[Any, Ctx], Done]]:
    def wrap(node_id: str, impl: Any, forward: Callable[[Any, Ctx], Done]) -> Callable[[Any, Ctx], Done]:
        if node_id not in g.memory.frozen:
            return forward

        def frozen(x: Any, ctx: Ctx) -> Done:
            with torch.no_grad():
                return forward(x, ctx)

        return frozen

    return wrap


def equip(g: Graph) -> Graph:
    """Give a graph (and its subgraphs) the torch codecs and the frozen-node runtime."""
    if not any(isinstance(c, TensorCodec) for c in g.codecs):
        g.use(codecs=(*g.codecs, TensorCodec(), NdarrayCodec()), wrap=_frozen_wrap(g))
    elif g.wrap is None:
        g.use(wrap=_frozen_wrap(g))
    for node_id in g.nodes():
        sub = g[node_id]
        if isinstance(sub, Graph):
            equip(sub)
    return g


def _frozen_holdings(m: nn.Module, g: Graph) -> Iterator[nn.Module]:
    for node_id, held in m.named_children():
        impl = g[node_id]
        if node_id in g.memory.frozen:
            yield held
        elif isinstance(impl, Graph):
            yield from _frozen_holdings(held, impl)


class GraphModule(nn.Module):
    """The ``nn.Module`` over a graph, made by ``module(g)``.

    ``forward(*args)`` wraps tensor inputs in ``Opaque`` (so the autograd graph runs
    through untouched), runs the graph and returns its output. When the graph caches
    a node, tensors that do not require grad enter as *data* instead, so they can be
    keyed. Metrics nodes return in ``Done`` are kept in ``.metrics`` after each call.

    Attributes:
        graph: the graph.
        step: the step number nodes see as ``ctx.step`` (the Trainer sets it).
        metrics: node id → metrics of the last call.
    """

    def __init__(self, g: Graph) -> None:
        super().__init__()
        object.__setattr__(self, "graph", equip(g))
        self.step = 0
        self.metrics: Mapping[str, Any] = {}
        self._program: Any = None
        self._sync()

    def _sync(self) -> None:
        """Register every node's modules and enforce frozen nodes (after any graph change)."""
        g = self.graph
        program = g.program()
        for name in list(self._modules):
            del self._modules[name]
        for name, held in _Nodes(g).named_children():
            self.add_module(name, held)
        for held in _frozen_holdings(self, g):
            held.requires_grad_(False)
            held.eval()
        self._program = program

    def train(self, mode: bool = True) -> GraphModule:
        super().train(mode)
        for held in _frozen_holdings(self, self.graph):
            held.eval()
        return self

    def forward(self, *args: Any) -> Any:
        g = self.graph
        program = g.program()
        if program is not self._program:
            self._sync()
        as_data = program.keyed
        inputs = [
            a if not isinstance(a, torch.Tensor) or (as_data and not a.requires_grad) else Opaque(a)
            for a in args
        ]
        outcome = g.run(*inputs, step=self.step, training=self.training)
        self.metrics = outcome.metrics
        return outcome.value

    def extra_repr(self) -> str:
        return f"graph={self.graph!r}"


def module(g: Graph) -> GraphModule:
    """The ``nn.Module`` over ``g`` (one per graph: calling again returns the same module).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from somatize import Graph, Node, Done, Opaque
        >>> class Linear(Node):
        ...     def __init__(self, i, o): self.lin = nn.Linear(i, o)
        ...     def forward(self, x, ctx): return Done(Opaque(self.lin(x)))
        >>> m = module(Graph.somatize(Linear(4, 2)))
        >>> sorted(m.state_dict())
        ['linear.lin.bias', 'linear.lin.weight']
        >>> m(torch.zeros(3, 4)).shape
        torch.Size([3, 2])
    """
    if not isinstance(g, Graph):
        raise TypeError(f"module() takes a somatize Graph, got {type(g).__qualname__}")
    m = _modules.get(g)
    if m is None:
        m = _modules[g] = GraphModule(g)
    elif g.program() is not m._program:
        m._sync()
    return m


def parameters(g: Graph) -> list[nn.Parameter]:
    """The trainable parameters of ``g``: deduplicated, frozen nodes excluded.

    Example:
        >>> opt = torch.optim.Adam(parameters(g), lr=1e-3)  # doctest: +SKIP
    """
    seen: set[int] = set()
    out = []
    for p in module(g).parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def state(g: Graph) -> dict[str, torch.Tensor]:
    """A snapshot of every node module's state: detached CPU copies, named as in
    ``module(g).state_dict()``."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module(g).state_dict().items()}


def load_state(g: Graph, snapshot: Mapping[str, torch.Tensor]) -> None:
    """Load a name-keyed state into the graph's modules (in place; keys then follow).

    Raises:
        StateError: missing or unexpected keys, or shape mismatches, all listed.
    """
    m = module(g)
    own = m.state_dict()
    missing = sorted(set(own) - set(snapshot))
    unexpected = sorted(set(snapshot) - set(own))
    shapes = [
        f"{k}: graph has {tuple(own[k].shape)}, state has {tuple(snapshot[k].shape)}"
        for k in own
        if k in snapshot and tuple(own[k].shape) != tuple(snapshot[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
    if unexpected:
        problems.append(
            f"unexpected keys: {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}"
        )
    if shapes:
        problems.append("shape mismatches: " + "; ".join(shapes[:10]))
    if problems:
        raise StateError(
            "the state does not fit the graph — " + " | ".join(problems)
            + " (was it saved from a different graph? compare sorted(state(g)) with the saved keys)"
        )
    m.load_state_dict(dict(snapshot), strict=True)
