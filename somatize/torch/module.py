"""A graph is an ``nn.Module``: ``module(g)``, ``parameters(g)``, ``state(g)``, ``load_state(g, s)``.

Every ``nn.Module`` a node holds — as an attribute, inside a list, tuple or dict
attribute, or in a node it holds — is registered under the node's id, so ``parameters()``,
``named_parameters()``, ``.to()``, ``.train()``/``.eval()``, ``state_dict()`` and
``load_state_dict()`` behave as for a hand-written module::

    model = module(g)                  # enc.emb.weight, classify.out.weight, ...
    opt = torch.optim.Adam(parameters(g), lr=1e-3)

Frozen nodes: parameters with ``requires_grad=False``, eval mode kept even when the
module is put in train mode (and ``ctx.training`` False), run under ``torch.no_grad()``
unless their input requires grad (gradients then pass through to the nodes before them).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.compiler import is_compiling as _is_compiling

from ..bulk import paused_gc
from ..errors import add_note
from ..graph import Graph
from ..node import HELD, Run
from .carry import refuse_remembered
from .codecs import TensorCodec
from .conversion import convert
from .freezers import _freezes, _settle_frozen, freeze, frozen_any, marked
from .frozen import equip, mode_refused
from .holdings import MODULE_NAMES
from .module_inputs import as_input, recording
from .not_a_graph import require_graph
from .own_code import give_own_code, without_own_code
from .registration import _check_shared, _frozen_holdings, _Nodes, _signature
from .state_hints import misfit_hint

__all__ = ["GraphModule", "module"]

# id(graph) -> its module. Weak on the module, which holds its graph: a registry keyed on
# the graph would keep every graph (and its weights) alive for ever.
_by_graph: weakref.WeakValueDictionary[int, GraphModule] = weakref.WeakValueDictionary()
# the mode each graph's module was last put in: a module made again (the first dropped)
# starts in it, as the nodes' modules are, not in training mode while they are in eval
_modes: weakref.WeakKeyDictionary[Graph, bool] = weakref.WeakKeyDictionary()
_RESERVED: list[frozenset[str]] = []
# GraphModule's plain attributes. They live in the instance dict, beside children of the
# same name (a subgraph written into ``>>`` gets the id "graph"), reached by named_children.
_OWN = frozenset({"graph", "step", "metrics"})
# Set in the instance dict directly too: the module's bookkeeping, written by every sync
# (nn.Module.__setattr__'s type checks, a µs each, a dozen times a fit) and no child's slot.
_PLAIN = _OWN | {"_program", "_frozen", "_holds", "_swaps", "_in_sync", "_synced", "_run"}


HELD.kinds = (nn.Module, nn.Parameter)  # assigned on a node: what a module registers changes


def _reserved() -> frozenset[str]:
    """Names a node id holding modules may not take at the top: attributes every module
    has, and those of ``GraphModule`` (inside a subgraph: only the former)."""
    if not _RESERVED:
        _RESERVED.append(MODULE_NAMES | (set(dir(GraphModule)) - _OWN))
    return _RESERVED[0]


class GraphModule(nn.Module):
    """The ``nn.Module`` over a graph, made by ``module(g)``.

    ``forward(*args)`` wraps tensor inputs in ``Opaque`` (so the autograd graph runs
    through untouched), runs the graph and returns its output. When the graph caches
    a node, tensors that do not require grad enter as *data* instead, so they can be
    keyed. A tuple, list or dict argument holding a tensor that requires grad is wrapped
    too (deeper, wrap it yourself: ``model(Opaque(batch))``). Metrics nodes return in ``Done`` are kept in ``.metrics`` after each call.

    Node modules register under the node id (``enc.emb.weight``); a subgraph's nest under
    its id (``sub.inner.lin.weight``). A node may be called ``graph``, ``step`` or
    ``metrics``: its modules register under that name (reach them with
    ``dict(m.named_children())[id]``) and the attributes below keep their meaning.

    Attributes:
        graph: the graph.
        step: the step number nodes see as ``ctx.step`` (the Trainer sets it).
        metrics: node id → metrics of the last call.
    """

    graph: Graph
    step: int
    metrics: Mapping[str, Any]
    _run: Run = Run()  # the last forward's, on the hot path (its step and mode, the graph's id)

    def __init__(self, g: Graph) -> None:
        super().__init__()
        object.__setattr__(self, "graph", g)
        self.step = 0
        self.metrics: Mapping[str, Any] = {}
        self._program: Any = None
        self._frozen: frozenset[str] = frozenset()  # paths of the nodes frozen at the last sync
        self._holds: Any = None  # what the nodes held at the last sync (_signature)
        self._swaps = HELD.swaps  # modules assigned on any node, counted, at the last sync
        self._in_sync = False
        give_own_code(self, "forward")  # compiled per graph: a sweep's share no recompile limit
        self._sync()

    def _sync(self) -> None:
        """Register every node's modules and enforce frozen nodes (after any graph change)."""
        self._in_sync = True  # (what it reads of the module does not sync again)
        try:
            self._register()
        finally:
            self._in_sync = False

    def _register(self) -> None:
        g = equip(self.graph)  # again: a subgraph may have been added since
        self._swaps = HELD.swaps
        for name in list(self._modules):
            del self._modules[name]
        nodes = _Nodes(g, _reserved())
        self._modules.update(nodes._modules)
        self._holds = nodes.signature
        frozen = dict(_frozen_holdings(self, g))
        if frozen:
            _check_shared(self, frozen)
        unfrozen = self._frozen - frozen.keys()
        if unfrozen:  # unfrozen since: back to the module's mode
            now = dict(self.named_modules())
            for path in unfrozen:
                if path in now:
                    now[path].train(self.training)
        freeze(self, frozen)
        self._frozen = frozenset(frozen)
        # The program is compiled by the first forward (_current), not here: a module made
        # for its parameters or its state alone (a federated server, a checkpoint) never
        # needs it, and a 1,000-node module(g) costs under half what it did with it.
        refuse_remembered(g)  # (a cached node whose Carry would stand still on a hit)
        self._program = None
        self._synced = g._stamp()  # what the graph was when its modules were registered

    def _refresh(self) -> GraphModule:
        """Register the graph's modules again if the graph changed since they were (a node
        added, a node frozen or unfrozen) or what a node holds did (``g["head"].lin =
        nn.Linear(...)``): what ``module(g)``, ``parameters(g)``, ``state(g)`` and the Trainer
        do — not every forward, which sees only graph changes. (Private: a public method's
        name could not be a node id holding modules.)"""
        _forget_digests(self.graph)
        if self._changed(holdings=True):
            self._sync()
        return self

    def _changed(self, holdings: bool) -> bool:
        """Whether the graph changed since the last sync (a stamp compared), or what its nodes
        hold did (a walk): with ``holdings``, or once a module or parameter was assigned on
        any node since (a count compared: ``g["head"].lin = ...``)."""
        if self.graph._stamp() != self._synced:
            return True
        swaps = HELD.swaps
        if not holdings and swaps == self._swaps:
            return False
        if _signature(self.graph) != self._holds:
            return True
        object.__setattr__(self, "_swaps", swaps)  # (another graph's node, or the same again)
        return False

    def _fresh(self, holdings: bool = False) -> None:
        """Register the modules again if the graph changed since they were (a node added,
        frozen or unfrozen: a stamp compared), before the module's own readers — state_dict,
        load_state_dict, parameters, buffers, train/eval — so a handle held across a change
        is never stale; also if a module or parameter was assigned on a node since (a count
        compared, then a walk). ``holdings``: walk in any case, for the readers called seldom
        — state_dict, load_state_dict, train/eval — so they also reach a module replaced
        inside a list or dict a node holds (``g["h"].blocks[0] = ...``), which no count sees."""
        if _is_compiling() or vars(self).get("_in_sync", False):
            return
        if self._changed(holdings):
            self._sync()

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self._fresh(holdings=True)
        return super().state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._fresh(holdings=True)  # (what load_state_dict calls, on this module or one holding it)
        super()._load_from_state_dict(*args, **kwargs)  # type: ignore[no-untyped-call]

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """``nn.Module.load_state_dict``. Keys that do not fit raise torch's ``RuntimeError``;
        when they are the graph's under other names (a plain model's, a wrapper's prefix, a
        whole checkpoint, a weight average alone) it carries a note naming the fix."""
        try:
            return super().load_state_dict(state_dict, strict, assign)
        except RuntimeError as e:  # torch's names the keys; add the fix when they say it
            hint = misfit_hint(self, state_dict, "model.load_state_dict({})", "model.state_dict()")
            if hint:
                add_note(e, hint)
            raise

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        self._fresh()
        return super().named_parameters(*args, **kwargs)

    def named_buffers(self, *args: Any, **kwargs: Any) -> Any:
        self._fresh()
        return super().named_buffers(*args, **kwargs)

    def named_modules(self, *args: Any, **kwargs: Any) -> Any:
        self._fresh()
        return super().named_modules(*args, **kwargs)

    def named_children(self) -> Any:
        self._fresh()
        return super().named_children()

    def _current(self) -> Any:
        """The graph's program, with the modules registered again first if the graph changed
        since they were; compiled here on the first forward after they were."""
        g = self.graph
        if g._stamp() != self._synced:
            self._sync()
        self._program = g.program()
        return self._program

    def _apply(self, fn: Any, recurse: bool = True) -> GraphModule:
        self._refresh()  # (.to() moves a module swapped into a node too)
        apply = super()._apply  # (the freeze's marks and claims follow what it converts)
        convert(self, lambda: apply(fn, recurse))  # type: ignore[no-untyped-call]
        self._holds = _signature(self.graph)  # the nodes now hold the moved tensors
        return self

    def __getstate__(self) -> dict[str, Any]:
        # The parameters freezing marked: a copy's are marked again (copy.deepcopy drops a
        # parameter's attributes, and a fresh process has marked none), so unfreezing works.
        frozen = [p for p in self.parameters() if marked(p)]
        state = without_own_code(super().__getstate__(), "forward")  # type: ignore[no-untyped-call]
        state.pop("_run", None)  # (the last forward's Run: its values, a mapping proxy)
        state.pop("_claims", None)  # (this module's: a copy claims its own, below)
        return {**state, "_somatize_marked": frozen}

    def __setstate__(self, state: dict[str, Any]) -> None:
        frozen = state.pop("_somatize_marked", ())
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        give_own_code(self, "forward")
        for p in frozen:
            _freezes(p, self)
        equip(self.graph)  # a copy (copy.deepcopy(model)) runs its own nodes, not the original's
        if _by_graph.get(id(self.graph)) is None:  # module(copy.graph) is this copy
            _by_graph[id(self.graph)] = self
            _modes[self.graph] = self.training
        self._holds = None  # (ids of the original's objects: compared, they would mean nothing)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PLAIN:  # never a child's slot, even when a node has this id
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def __prepare_scriptable__(self) -> GraphModule:  # what torch.jit.script asks first
        raise TypeError(
            "module(g) cannot be scripted (torch.jit.script): the graph's runtime is Python, "
            "dispatching on values and keys. Export what it computes on an example input "
            "instead: torch.export.export(model, (x,)) (docs/deploy.md)"
        )

    def __getattr__(self, name: str) -> Any:
        # a child (a node's holder) read as an attribute, model.head: registered again first
        # if a module was swapped into a node since, so model.head.out is the node's own
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules and not _is_compiling():
            self._fresh()
            held = self.__dict__["_modules"].get(name)
            if held is not None:
                return held
        return super().__getattr__(name)

    def requires_grad_(self, requires_grad: bool = True) -> GraphModule:
        super().requires_grad_(requires_grad)
        if requires_grad and frozen_any():  # a frozen node's parameters stay frozen
            _settle_frozen(self)
        return self

    def train(self, mode: bool = True) -> GraphModule:
        self._fresh(holdings=True)  # a module swapped into a node since: .eval() reaches it
        try:
            super().train(mode)
        except NotImplementedError as e:  # (a torch.export module: its mode is fixed)
            raise mode_refused(self, mode, e) from e
        _modes[self.graph] = mode
        for _, held in _frozen_holdings(self, self.graph):
            held.eval()
        return self

    def forward(self, *args: Any) -> Any:
        g = self.graph
        if compiling := _is_compiling():  # (a constant to dynamo, guarding nothing)
            _prepare(self)  # called as it is: dynamo traces no compiler, and no recompile
        program = g.program()
        if program is not self._program:
            program = self._current()
        if (
            len(args) == 1
            and isinstance(args[0], torch.Tensor)
            and not (program.keyed or g.watchers or g.placement.hosts)
        ):  # the training hot path: one tensor, Opaque, straight to the plan's loop
            if compiling:  # (a trace reads or writes nothing kept between calls)
                run, steps = Run(g.run_id, self.step, self.training), None
            else:  # the last call's Run, and each node's Ctx, while the step and mode stay
                run, step, training = self._run, self.step, self.training
                if run[1] != step or run[2] is not training or run[0] != g.run_id:
                    run = self._run = Run(g.run_id, step, training)
                steps = program.bound(run)
            value, metrics = program.run_fast(args[0], run, steps)
            if metrics or self.metrics:  # (none before, none now: no write for dynamo to see)
                self.metrics = metrics
            return value
        as_data = program.keyed
        if as_data and recording():
            cached = sorted({*g.memory.cached, *g.memory.named})
            raise TypeError(
                f"this graph caches {', '.join(map(repr, cached)) or 'a subgraph node'}, and "
                "torch.compile (Options(compile=...) too), a trace, an export or a torch.func "
                "transform (grad, vmap) cannot record a cache (it looks up each input's bytes): "
                "compile the part after it inside its node (docs/caching.md, 'torch.compile "
                f"with a cached prefix'), or run it with caching off (g.cache("
                f"{(cached or ['node'])[0]!r}, False); a frozen node still runs frozen)"
            )
        inputs = [as_input(a, as_data) for a in args]
        outcome = g.run(*inputs, step=self.step, training=self.training)
        self.metrics = outcome.metrics
        return outcome.value

    def extra_repr(self) -> str:
        return f"graph={self.graph!r}"


def _prepare(m: GraphModule) -> bool:
    """``m._current()`` run as it is, not traced, when dynamo traces a forward: the first
    forward of ``torch.compile(module(g))`` finds the program built and the module current,
    so what it traces reads them as on every later call."""
    m._current()
    return True


# What torch._dynamo.assume_constant_result sets (a test checks it still is), without
# importing dynamo, hundreds of modules, into every process that makes a module
_prepare._dynamo_marked_constant = True  # type: ignore[attr-defined]


def module(g: Graph) -> GraphModule:
    """The ``nn.Module`` over ``g``.

    One per graph: while the module is alive, calling again returns it. The weights live
    in the nodes, so a module made again after the first was dropped holds the same ones,
    and it starts in the mode (``train``/``eval``) the first was left in. A copy of the
    module (``copy.deepcopy``, ``torch.load``) is the module of its copy of the graph:
    ``module(copy.graph) is copy``.

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
        require_graph(g, "st.module")
    m = _by_graph.get(id(g))
    with paused_gc():  # one nn.Module per node: many objects, no cycles (see somatize.bulk)
        if m is None or m.graph is not g:
            _forget_digests(g)
            m = GraphModule(g)
            if _modes.get(g) is False:  # (made again: in the mode the last one was left in)
                m.train(False)
            _by_graph[id(g)] = m
        else:
            m._refresh()
    return m


def _forget_digests(g: Graph) -> None:
    """The tensor codecs hash every tensor afresh after ``module(g)`` (every ``fit``): writes
    that do not move a version counter (``p.data``, fused optimizers) are seen then."""
    for c in g.codecs:
        if isinstance(c, TensorCodec):
            c.forget()
    for sub in g._subgraphs().values():
        _forget_digests(sub)
