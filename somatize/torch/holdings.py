"""What one node holds, registered as ``nn.Module`` children: ``node_holdings(impl, where)``.

``module(g)`` registers every node's modules, parameters and tensors under the node id
(``enc.emb.weight``): each node that holds any gets one ``Holdings`` module, made by
``blank`` without ``nn.Module.__init__`` and with its hook tables made only if touched
(``blank.lazy``), since ``module(g)`` never hooks or calls it.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import StateError
from ..node import Mapped, Node
from ..stack import outside
from .blank import lazy, maker

__all__ = [
    "MODULE_NAMES",
    "Holdings",
    "held_by",
    "holdings_signature",
    "holds_any",
    "node_holdings",
    "node_signature",
]

_PLAIN = frozenset({int, float, str, bool, type(None), bytes})
_NONE: frozenset[str] = frozenset()
_OWN = frozenset({"_impl"})  # Holdings' own attribute
MODULE_NAMES = frozenset(dir(nn.Module()))  # attributes every module has


class _Mirror(dict):  # type: ignore[type-arg]
    """A ``Holdings``' table of parameters or buffers, all of them the node's own attributes:
    an entry written into it is written on the node too, so the node's forward reads it.
    ``torch.func.functional_call`` (and ``vmap``/``grad`` over it) and ``.to()`` write these
    tables directly, not through ``setattr``."""

    __slots__ = ("impl",)
    impl: Any

    def __setitem__(self, name: str, value: Any) -> None:
        dict.__setitem__(self, name, value)
        if name in vars(self.impl):  # (object's: a frozen dataclass node is written too)
            object.__setattr__(self.impl, name, value)

    def __reduce__(self) -> Any:  # (pickle sets items before slots: made whole instead)
        return _remade, (self.impl, dict(self))


def _remade(impl: Any, items: dict[str, Any]) -> _Mirror:
    mirror = _Mirror(items)
    mirror.impl = impl
    return mirror


def _mirrored(held: nn.Module) -> None:
    """Make ``held``'s parameter and buffer tables ``_Mirror``s of its node (once)."""
    own = vars(held)
    for table in ("_parameters", "_buffers"):
        if type(own[table]) is not _Mirror:
            own[table] = _remade(own["_impl"], own[table])


@lazy  # (never hooked by module(g): its hook tables are made only if touched)
class Holdings(nn.Module):
    """The modules, parameters and tensors one node holds, registered under the node id.

    Direct attributes: modules, parameters, and plain tensors (as buffers); one written
    here is written on the node too, so its forward reads it — assigned
    (``model.head.lin = nn.Linear(...)``), moved by ``.to()``, or swapped in for a call by
    ``torch.func.functional_call``. Inside list, tuple and dict attributes (nested too),
    and any mapping, namedtuple or dataclass: modules, named by index, key or field
    (``heads.0``, ``heads.fr``); a parameter there is an error (it would not be trained:
    ``nn.ParameterList`` holds parameters). A node held by the node
    (a ``Mapped`` node's inner node, a helper node) registers its own holdings nested.
    """

    _impl: Any

    def _get_name(self) -> str:  # printed as the node's class: Encode( (emb): Embedding(...) )
        return type(self._impl).__qualname__

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not isinstance(value, (nn.Module, torch.Tensor)) or name in _OWN:
            return  # (the mode flag, Holdings' own attributes)
        impl = vars(self)["_impl"]
        if name not in vars(impl):
            return  # not an attribute of the node: registered here only, as on any module
        # ``model.head.lin = nn.Linear(...)``: the node's attribute too, so forward runs it
        setattr(impl, name, value)
        if isinstance(value, torch.Tensor):
            _mirrored(self)  # and kept so: .to() and functional_call write the tables

    def add_module(self, name: str, module: nn.Module | None) -> None:
        """As ``nn.Module``'s; a module replacing one the node holds is written on the node
        too, so forward runs it: what converters that rebuild a model child by child write
        through (``nn.SyncBatchNorm.convert_sync_batchnorm``, ``register_module``)."""
        super().add_module(name, module)
        impl = vars(self)["_impl"]
        if isinstance(module, nn.Module) and name not in _OWN and name in vars(impl):
            setattr(impl, name, module)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        node = type(self._impl).__qualname__
        raise TypeError(
            f"this module holds the modules of a {node} node (its parameters, for state_dict "
            "and .to()); the node is not called through it: call the graph's module "
            "(st.module(g)(x)), or a module the node holds (model.<node>.<attribute>)"
        )

    def register_forward_hook(self, hook: Any, *args: Any, **kwargs: Any) -> Any:
        _warn_hook(self, "forward")
        return super().register_forward_hook(hook, *args, **kwargs)

    def register_forward_pre_hook(self, hook: Any, *args: Any, **kwargs: Any) -> Any:
        _warn_hook(self, "forward")
        return super().register_forward_pre_hook(hook, *args, **kwargs)

    def register_full_backward_hook(self, hook: Any, *args: Any, **kwargs: Any) -> Any:
        _warn_hook(self, "full_backward")
        return super().register_full_backward_hook(hook, *args, **kwargs)

    def register_full_backward_pre_hook(self, hook: Any, *args: Any, **kwargs: Any) -> Any:
        _warn_hook(self, "full_backward")
        return super().register_full_backward_pre_hook(hook, *args, **kwargs)


def _warn_hook(held: Holdings, kind: str) -> None:
    warnings.warn(
        f"a {kind.replace('_', ' ')} hook on the module holding a "
        f"{type(held._impl).__qualname__} node's modules never runs: the node is called by "
        "the graph, not through this module. Hook a module the node holds "
        f"(model.<node>.<attribute>.register_{kind}_hook), or read the node's output from a "
        "node after it or from the metrics it returns in Done",
        UserWarning,
        stacklevel=outside(),
    )


_new_holdings = maker(Holdings, "_modules", "_impl")  # (children, impl) -> Holdings

# Attribute names a module held under goes straight into the children table: not empty,
# without '.', neither an attribute every module has nor Holdings' own nor somatize's. Read
# first for each module a node holds (a set lookup, where the checks cost a few of them).
_DIRECT: set[str] = set()


def _direct(name: str) -> bool:
    ok = (
        bool(name)
        and "." not in name
        and name not in MODULE_NAMES
        and name not in _OWN
        and not name.startswith("_somatize")
    )
    if ok and len(_DIRECT) < 10_000:  # (bounded: names made on the fly are checked each time)
        _DIRECT.add(name)
    return ok


# the attributes warned about, by node (weakly: a node that goes frees its entry)
_told: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _warn_untrained(impl: Any, where: str, name: str) -> None:
    """Warn, once per node attribute, that a tensor requiring grad is held as a buffer:
    only an ``nn.Parameter`` is a parameter, so no optimizer would ever train it."""
    try:
        told = _told.setdefault(impl, set())
    except TypeError:  # a node that is not hashable or weakly referable: told every time
        told = set()
    if name in told:
        return
    told.add(name)
    warnings.warn(
        f"{name!r} of node {where!r} is a tensor that requires grad, but not an "
        "nn.Parameter, so it is registered as a buffer: st.parameters(g) leaves it out "
        f"and no optimizer trains it. To train it, make it a parameter: self.{name} = "
        f"nn.Parameter(torch.randn(...)); if it is meant to stay, make it without "
        "requires_grad=True (or .detach() it)",
        UserWarning,
        stacklevel=outside(),
    )


def node_holdings(
    impl: Any, where: str, seen: frozenset[int] = frozenset(), sig: list[Any] | None = None
) -> Holdings | None:
    """The ``Holdings`` of the node ``impl`` (at ``where``, for error messages), or None
    when it holds no module and no tensor. Given ``sig``, what ``node_signature`` appends
    is appended to it, found in the same walk."""
    own = vars(impl)
    children: dict[str, Any] = {}  # the Holdings' table of modules, filled before it is made
    held: Holdings | None = None
    inside, bare = seen, False
    first: list[str] | None = None  # on its first registration, the tensors it holds
    kept: frozenset[str] | None = own.get("_somatize_kept")  # (None: its first registration)
    for name, value in own.items():
        if type(value) in _PLAIN:
            continue  # (most attributes: numbers, strings, flags)
        if isinstance(value, nn.Module) and (name in _DIRECT or _direct(name)):
            children[name] = value  # (most of the rest: a module under a name add_module takes)
            if sig is not None:  # (flat: a tuple a node costs more than the rest of its walk)
                sig.append(name)
                sig.append(id(value))
            continue
        if name.startswith("_somatize"):
            continue
        inner: nn.Module | torch.Tensor | None
        if isinstance(value, (nn.Module, torch.Tensor)):
            inner = value
            if sig is not None:
                sig.append(name)
                sig.append(id(value))
        else:
            if inside is seen:
                inside = seen | {id(impl)}
            if sig is not None and (part := holdings_signature(value, inside)) is not None:
                sig.append(name)
                sig.append(part)
            inner = held_by(value, f"{where}.{name}", inside)
            if inner is None:
                continue
        if name in MODULE_NAMES:
            raise StateError(
                f"node {where!r} holds modules or tensors in its attribute {name!r}, which "
                "every nn.Module already has; rename the attribute"
            )
        if held is None:  # nn.Module.__init__'s attributes at a dict's cost (see blank.py)
            held = _new_holdings(children, impl)
        if isinstance(inner, nn.Module):
            if name and "." not in name and name not in _OWN:
                children[name] = inner  # (held's table) what add_module checks, checked above
            else:
                held.add_module(name, inner)  # raises its own error
        elif isinstance(inner, nn.Parameter):
            held.register_parameter(name, inner)
            bare = True
        else:
            if inner.requires_grad:
                _warn_untrained(impl, where, name)
            if kept is None:
                first = [*first, name] if first else [name]
            # state (saved, loaded) if held when first registered, not if a forward set it
            held.register_buffer(name, inner, persistent=kept is None or name in kept)
            bare = True
    if kept is None:
        own["_somatize_kept"] = frozenset(first) if first else _NONE
    if held is None:  # (holdings are made only for something registered: never empty)
        return _new_holdings(children, impl) if children else None
    if bare:
        _mirrored(held)  # (only a node holding a bare tensor pays for it)
    return held


def node_signature(node: Node, out: list[Any]) -> None:
    """Append to ``out`` what ``node`` registers, flat: each attribute's name, then its
    ``holdings_signature`` (never a string, so the names stand out). What ``node_holdings``
    appends to its ``sig`` in the same walk as registering."""
    seen = frozenset({id(node)})
    for name, value in vars(node).items():
        if type(value) in _PLAIN or name.startswith("_somatize"):
            continue
        if isinstance(value, (nn.Module, torch.Tensor)):
            out.append(name)
            out.append(id(value))
        elif (part := holdings_signature(value, seen)) is not None:
            out.append(name)
            out.append(part)


def holdings_signature(value: Any, seen: frozenset[int] = frozenset()) -> Any:
    """What ``value`` (a node, or one of its attributes) registers, as ids: the modules and
    tensors ``node_holdings`` would register, by attribute, index or key. Equal between two
    calls when nothing was assigned in between (``node.lin = nn.Linear(...)``), and cheaper
    than registering. (Ids of objects the registration holds, so none is reused meanwhile.)
    None when it registers nothing."""
    if isinstance(value, (nn.Module, torch.Tensor)):
        return id(value)
    if isinstance(value, Mapped):
        return holdings_signature(value.inner, seen)
    out: list[tuple[Any, Any]] = []
    if isinstance(value, Node):
        if id(value) in seen:
            return None
        inside = seen | {id(value)}
        for name, v in vars(value).items():
            if type(v) in _PLAIN or name.startswith("_somatize"):
                continue
            sig = holdings_signature(v, inside)
            if sig is not None:
                out.append((name, sig))
        return tuple(out) or None
    items = _items(value)
    for k, v in items if items is not None else ():
        sig = holdings_signature(v, seen)
        if sig is not None:
            out.append((k, sig))
    return tuple(out) or None


def held_by(value: Any, where: str, seen: frozenset[int] = frozenset()) -> nn.Module | None:
    """The module registering what ``value`` holds, or None when it holds no module."""
    if isinstance(value, nn.Module):
        return value
    if isinstance(value, Mapped):  # a mapped node is its inner node, applied item by item
        return held_by(value.inner, where, seen)
    if isinstance(value, Node):
        if id(value) in seen:  # nodes holding each other: the first visit registers them
            return None
        return node_holdings(value, where, seen)
    items = _items(value)
    if items is None:
        return None
    box = nn.Module()
    for k, v in items:
        name = str(k)
        if isinstance(v, torch.Tensor) and (isinstance(v, nn.Parameter) or v.requires_grad):
            raise _untrainable(f"{where}[{k!r}]", v, value)
        inner = held_by(v, f"{where}[{k!r}]", seen)
        if inner is None:
            continue
        if not name or "." in name or name in box._modules:
            raise StateError(
                f"{where}[{k!r}] holds a module that cannot be registered under the name "
                f"{name!r} (names must be non-empty, without '.', and distinct as strings); "
                "use plain string keys without '.' or an nn.ModuleDict"
            )
        box.add_module(name, inner)
    return box if box._modules else None


def _untrainable(where: str, t: torch.Tensor, container: Any) -> StateError:
    what = "an nn.Parameter" if isinstance(t, nn.Parameter) else "a tensor that requires grad"
    kind = type(container).__name__
    return StateError(
        f"{where} is {what} inside a {kind}: module(g) registers the modules a {kind} holds, "
        "not its tensors (as nn.Module does), so st.parameters(g) would leave it out and no "
        "optimizer would train it — hold them in an nn.ParameterList or nn.ParameterDict, or "
        "each in an attribute of its own"
    )


def _items(value: Any) -> Iterable[tuple[Any, Any]] | None:
    """(name, item) of a container that may hold modules: a list, tuple or dict, and any
    mapping (``OrderedDict``), namedtuple (by field) or dataclass; None for anything else."""
    t = type(value)
    if t is list or t is tuple:
        return enumerate(value)
    if t is dict or isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return zip(value._fields, value)
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    return None


def holds_any(m: nn.Module) -> bool:
    """Whether ``m`` registers anything: a parameterless module (dropout) counts, for its mode."""
    return bool(m._modules or m._parameters or m._buffers)
