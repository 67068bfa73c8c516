"""The Node protocol and the two values it meets: ``Ctx`` coming in, ``Done`` going out.

A node is a function with state: ``forward(x, ctx) -> Done``. Subclass ``Node``;
its constructor arguments are recorded without you writing anything, and become
the node's *declaration* when a key is needed (``Embed(512)`` differs from
``Embed(64)``).

Example:
    >>> class Double(Node):
    ...     def forward(self, x, ctx):
    ...         return Done(2 * x)
    >>> from somatize import Graph
    >>> Graph.somatize(Double() >> Double()).forward(3)
    12
"""

from __future__ import annotations

import difflib
import types
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from . import not_a_module
from .compose import Composable
from .errors import MissingValueError, NodeError
from .not_a_node import is_torch_module
from .values import Opaque, check

if TYPE_CHECKING:
    from .dsl import Expr

__all__ = ["Ctx", "Done", "Mapped", "Node", "Run"]


class _NoValues(dict[str, Any]):
    """The empty dict under a run given no values (read through a ``MappingProxyType``):
    a name read from it raises ``MissingValueError`` saying how to pass it. (A run given
    values reads them from a plain dict, at a plain dict's cost.)"""

    __slots__ = ()

    def __missing__(self, name: Any) -> Any:
        raise MissingValueError(
            f"ctx.values[{name!r}]: this run was given no values; pass it as "
            f"g.forward(x, values={{{name!r}: ...}}), or read it with a default: "
            f"ctx.get({name!r}, default)"
        )


_NO_VALUES: Mapping[str, Any] = types.MappingProxyType(_NoValues())


class _Values(dict[str, Any]):
    """The values a run was given: a name it was not given raises ``MissingValueError``
    naming the ones it was (a misspelt or forgotten name), at a plain dict's cost on a hit."""

    __slots__ = ()

    def __missing__(self, name: Any) -> Any:
        given = ", ".join(repr(k) for k in sorted(self))
        raise MissingValueError(
            f"ctx.values[{name!r}]: this run was given values for {given} but not "
            f"{name!r}; add it: g.forward(x, values={{..., {name!r}: ...}}), or read it "
            f"with a default: ctx.get({name!r}, default)"
        )


def injected_values(values: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The read-only ``ctx.values`` of a run given ``values`` (or none)."""
    return types.MappingProxyType(_Values(values)) if values else _NO_VALUES


class Done(NamedTuple):
    """What a node returns: its value, and optionally scalars for watchers.

    Args:
        value: data, a codec value (a detached tensor), or ``Opaque(x)``.
        metrics: name → scalar, reported upward to watchers and the Trainer.
    """

    value: Any
    metrics: Mapping[str, Any] | None = None


class Run(NamedTuple):
    """What one execution of a graph shares with every node: run id, step, mode, injected values."""

    id: str = ""
    step: int = 0
    training: bool = False
    values: Mapping[str, Any] = _NO_VALUES


class Ctx(NamedTuple):
    """The read-only channel from whoever executes a node to the node.

    Attributes:
        node: the node's id in its graph.
        device: where the node should put its tensors (from the placement), or None.
        run: the ``Run`` this call belongs to (id, step, training flag, injected values).
    """

    node: str
    device: str | None = None
    run: Run = Run()

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def step(self) -> int:
        return self.run.step

    @property
    def training(self) -> bool:
        return self.run.training

    @property
    def values(self) -> Mapping[str, Any]:
        """Values injected by the caller (``g.forward(x, values={...})``)."""
        return self.run.values

    def get(self, name: str, default: Any = None) -> Any:
        return self.run.values.get(name, default)


# node classes whose forward takes (x, ctx): checked once each; weakly, so a class made per
# run (a factory's `class Enc(Node)` in a sweep) is not kept for ever with what it holds
_CHECKED: weakref.WeakSet[type] = weakref.WeakSet()


def check_forward(node_id: str, impl: Any) -> None:
    """Refuse a node whose ``forward`` cannot be called as ``forward(x, ctx)``.

    Raises:
        NodeError: ``forward`` takes fewer than two positional arguments (``ctx``
            forgotten), or requires more than two (one per input: they come as one tuple);
            the class defines no ``forward``, or is an ``nn.Module`` too (a mapped node's
            inner node is checked alike).
    """
    if isinstance(impl, Mapped):  # (its own forward is ours; checked is what it maps)
        impl = impl.inner
    cls = type(impl)
    if cls in _CHECKED:
        return
    if cls.forward is Node.forward and "forward" not in getattr(impl, "__dict__", ()):
        own = [n for c in cls.__mro__ if c not in Node.__mro__ for n in vars(c)]
        near = difflib.get_close_matches("forward", own, n=1, cutoff=0.75)  # foward, Forward
        hint = f" ({near[0]} is not forward: a typo?)" if near else ""
        if "__call__" in own:
            hint = " (the graph calls forward(x, ctx), never the node: rename __call__ forward)"
        raise NodeError(
            f"node {node_id!r}: {cls.__qualname__} must implement forward(self, x, ctx) -> Done; "
            f"it defines no forward{hint}"
        )
    if is_torch_module(cls):
        raise NodeError(
            f"node {node_id!r}: {cls.__qualname__} is an nn.Module as well as a Node, but a node "
            "holds its modules and is not one (torch would call forward(x) without ctx, and "
            "st.module(g) registers what a node holds): subclass Node alone, "
            f"class {cls.__name__}(Node), keeping self.lin = nn.Linear(...) in __init__ "
            "(no super().__init__() needed)"
        )
    import inspect

    try:
        params = inspect.signature(impl.forward).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read, let it run
        _CHECKED.add(cls)
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        names = ", ".join(["self", *(p.name for p in positional)])
        raise NodeError(
            f"node {node_id!r}: {cls.__qualname__}.forward({names}) takes no ctx, but every "
            "node is called as forward(x, ctx); write def forward(self, x, ctx) (ctx may go unused)"
        )
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 2:
        names = ", ".join(["self", *(p.name for p in positional)])
        first = ", ".join(p.name for p in required[:-1])
        raise NodeError(
            f"node {node_id!r}: {cls.__qualname__}.forward({names}) takes {len(required)} "
            "arguments, but every node is called as forward(x, ctx), a node with several "
            f"inputs receiving them as one tuple x; write def forward(self, x, ctx): {first} = x"
        )
    _CHECKED.add(cls)


class _Held:
    """What assignments on nodes tell the layer that registers their modules: the attribute
    kinds whose assignment changes what a module made from a graph registers (``nn.Module``
    and ``nn.Parameter``, set by ``somatize.torch``; none without it), and how many such
    assignments were made. A module compares the count (one int) before ``parameters()``, so
    a head swapped on a node (``g["head"].lin = nn.Linear(8, 3)``) is registered before an
    optimizer reads it, while a tensor a forward writes on its node costs nothing."""

    kinds: tuple[type, ...] = ()
    swaps = 0


HELD = _Held


class Node(Composable):
    """Base class of user nodes: implement ``forward(self, x, ctx) -> Done``.

    Nodes hold their modules as attributes; they are not ``nn.Module``s themselves
    (torch would call ``forward`` without ``ctx``). ``somatize.torch.module(g)``
    registers their modules. Compose nodes with ``a >> b`` (sequence) and
    ``a | b`` (fork; the next node receives both outputs in written order).
    """

    _somatize_args: tuple[tuple[Any, ...], dict[str, Any]]
    #: Whether each row of a batch is computed from that row alone (no batch norm in train
    #: mode, no attention across the batch). A frozen node is taken to qualify (eval mode
    #: removes the batch statistics of a batch norm that keeps running ones — one without
    #: is refused — not a forward that mixes rows itself, which must not be cached per
    #: example); a trainable node must say so (``g.cache(id, per="example")``).
    rowwise: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if (args or kwargs) and cls.__init__ is object.__init__:
            given = len(args) + len(kwargs)
            raise TypeError(
                f"{cls.__qualname__}() takes no arguments (it defines no __init__), but was "
                f"given {given}; define __init__(self, ...) to take them, or write "
                f"{cls.__qualname__}()"
            )
        self = object.__new__(cls)
        # The declaration: recorded here, canonicalised only when a key is needed.
        self.__dict__["_somatize_args"] = (args, kwargs)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        kinds = HELD.kinds  # (a module or parameter put in or taken out: counted)
        if kinds and (isinstance(value, kinds) or isinstance(self.__dict__.get(name), kinds)):
            HELD.swaps += 1
        super().__setattr__(name, value)

    def forward(self, x: Any, ctx: Ctx) -> Done:
        raise NodeError(f"{type(self).__qualname__} must implement forward(self, x, ctx) -> Done")

    # node(x), node.parameters(): a node is not an nn.Module; errors naming what to write
    __call__ = not_a_module.node_called

    def mapped(self) -> Mapped:
        """This node applied item by item over a list; with caching, each item is keyed alone."""
        return Mapped(self)

    def with_id(self, node_id: str) -> Expr:
        """This node under an explicit id, for use in ``>>`` / ``|`` expressions; ``.mapped()``
        may follow (as it may come before), and a second ``with_id`` renames. One instance
        written under two ids is two nodes sharing it, weights too (a siamese encoder)."""
        from .dsl import Ref

        return Ref(self, node_id)

    def __repr__(self) -> str:  # Lin(4, 8, bias=False): how it was made, long values elided
        args, kwargs = self.__dict__.get("_somatize_args", ((), {}))
        shown = [*map(_short, args), *(f"{k}={_short(v)}" for k, v in kwargs.items())]
        return f"{type(self).__name__}({', '.join(shown)})"


not_a_module.install(Node, "node")  # node.parameters(), node.to(...): errors naming the fix


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 and "\n" not in text else f"<{type(value).__qualname__}>"


class Mapped(Node):
    """A node applied to each item of a list input; the output is the list of results.

    Made by ``node.mapped()``. When the mapped node is cached, every item is keyed by
    its own content, so a batch of mostly-seen items computes only the new ones. Each
    metric its items report is the mapped node's as the mean over the items reporting it.
    """

    def __init__(self, inner: Node) -> None:
        if isinstance(inner, Mapped):
            raise TypeError(
                f"{inner!r:.60} is mapped already, and mapped() applies only once; "
                "write node.mapped() once"
            )
        if not isinstance(inner, Node):
            raise TypeError(
                f"mapped() applies to a Node, not to {inner!r:.40} ({type(inner).__qualname__}); "
                "write node.mapped() on a Node instance"
            )
        self.inner = inner

    def forward(self, x: Any, ctx: Ctx) -> Done:
        if type(x) is not list and type(x) is not tuple:
            raise NodeError(
                f"mapped node '{ctx.node}' received a {type(x).__name__}; "
                "a mapped node takes a list (or tuple) and applies itself to each item"
                + (": to map a tensor's rows, give it x.unbind(0)" if hasattr(x, "unbind") else "")
            )
        return Done(*map_items(self.inner, x, ctx, ctx.node))

    def __repr__(self) -> str:
        return f"{self.inner!r}.mapped()"


def not_done(node_id: str, impl: Any, got: Any) -> NodeError:
    """The error for a node whose forward returned something other than ``Done``."""
    return NodeError(
        f"node {node_id!r} ({type(impl).__qualname__}) returned {type(got).__name__} "
        "instead of Done — end forward with `return Done(value)`"
    )


def call(impl: Node, x: Any, ctx: Ctx, node_id: str) -> Done:
    """Call ``impl.forward`` and hold it to the contract: it must return ``Done``."""
    done = impl.forward(x, ctx)
    if type(done) is not Done:
        raise not_done(node_id, impl, done)
    return done


def map_items(inner: Node, items: Any, ctx: Ctx, node_id: str) -> tuple[Any, Any]:
    """Apply ``inner`` to each item: (the list of values, the items' merged metrics or None);
    all values Opaque gives one Opaque list."""
    done = [call(inner, item, ctx, node_id) for item in items]
    out = [d.value for d in done]
    metrics = item_metrics([d.metrics for d in done])
    opaque = [type(v) is Opaque for v in out]
    if all(opaque) and out:
        return Opaque([v.value for v in out]), metrics
    if any(opaque):
        raise NodeError(
            f"mapped node '{node_id}' returned Opaque for some items and data for others; "
            "return the same kind for every item"
        )
    return out, metrics


def item_metrics(reported: list[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The metrics of a mapped node from its items': each name the mean over the items that
    reported it (numbers and one-element tensors average as they are); a value that does
    not average (a string) is the last item's. None when no item reported any."""
    by_name: dict[str, list[Any]] = {}
    for m in reported:
        for k, v in (m or {}).items():
            by_name.setdefault(k, []).append(v)
    if not by_name:
        return None
    merged = {}
    for k, vs in by_name.items():
        try:
            merged[k] = vs[0] if len(vs) == 1 else sum(vs[1:], vs[0]) / len(vs)
        except TypeError:
            merged[k] = vs[-1]
    return merged


def graph_input(
    inputs: tuple[Any, ...], values: Any, codecs: Any
) -> tuple[Any, bool, Mapping[str, Any]]:
    """What ``Graph.forward(*inputs, values=values)`` runs on: (x, whether x is Opaque,
    the injected values, read-only). Each input that is not ``Opaque`` is checked as data,
    also beside one that is.

    Raises:
        ValueConversionError: an input is not data (naming which one).
        TypeError: ``values`` is not a mapping with str keys.
    """
    if values is not None and not (
        isinstance(values, Mapping) and all(type(k) is str for k in values)
    ):
        raise TypeError(
            f"forward(..., values={values!r}): values is a mapping of str names to what "
            "nodes read as ctx.values[name], e.g. values={'lr': 0.1}"
        )
    injected = injected_values(values)
    if len(inputs) == 1:
        x = inputs[0]
        opaque = type(x) is Opaque
        if not opaque:
            check(x, codecs, "the graph input")
        return (x.value if opaque else x), opaque, injected
    opaque = any(type(i) is Opaque for i in inputs)
    if not opaque:
        check(inputs, codecs, "the graph input")
    for n, i in enumerate(inputs):
        if type(i) is not Opaque:
            check(i, codecs, f"graph input {n} (beside an Opaque one)")
    return tuple(i.value if type(i) is Opaque else i for i in inputs), opaque, injected
