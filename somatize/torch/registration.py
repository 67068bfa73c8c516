"""What a graph's nodes register as ``module(g)``'s children: ``_Nodes``, the table of
every node's holdings by node id (subgraphs nested); ``_signature``, what they hold, to
see a change; and the frozen nodes' holdings, checked for a module shared with a
trainable node."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..errors import StateError
from ..graph import Graph
from ..node import Mapped, Node
from .holdings import (
    MODULE_NAMES,
    held_by,
    holdings_signature,
    holds_any,
    node_holdings,
    node_signature,
)

__all__: list[str] = []


class _Nodes(nn.Module):
    """The holdings of every node of a (sub)graph, by node id; and ``signature``, what
    ``_signature(g)`` says of them (found while registering them: one walk)."""

    signature: list[Any]

    def __init__(self, g: Graph, reserved: frozenset[str], prefix: str = "") -> None:
        super().__init__()
        modules = self._modules
        signature: list[Any] = []  # (_signature's, found in the same walk)
        put = signature.append
        for node_id, impl in g._impls.items():
            label = prefix + node_id if prefix else node_id
            put(node_id)
            if isinstance(impl, Node) and not isinstance(impl, Mapped):  # (most nodes)
                # (holdings are made only for something registered: never empty)
                held: nn.Module | None = node_holdings(impl, label, sig=signature)
                if held is None:
                    continue
            else:
                put(_signature(impl) if isinstance(impl, Graph) else holdings_signature(impl))
                held = (
                    _Nodes(impl, MODULE_NAMES, label + ".")
                    if isinstance(impl, Graph)
                    else held_by(impl, label)
                )
                if held is None or not holds_any(held):
                    continue
            if "." in node_id or node_id in reserved:
                why = (
                    "a module name cannot contain '.'"
                    if "." in node_id
                    else f"{node_id!r} is already an attribute of the module registering it"
                )
                raise StateError(
                    f"node {label!r} holds modules, which are registered under its id, but {why}; "
                    "give the node another id (g.node('other_id', ...) or node.with_id('other_id'))"
                )
            modules[node_id] = held  # (add_module refuses the ids of _OWN at the top)
        object.__setattr__(self, "signature", signature)

    def _get_name(self) -> str:
        return "Graph"


def _frozen_holdings(m: nn.Module, g: Graph, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """(module path, holdings) of every frozen node, subgraphs included."""
    children = m._modules
    for node_id in g.nodes() if g.memory.frozen else ():
        held = children.get(node_id)
        if node_id in g.memory.frozen and held is not None:
            yield prefix + node_id, held
    for node_id, sub in g._subgraphs().items():
        held = children.get(node_id)
        if node_id not in g.memory.frozen and held is not None:
            yield from _frozen_holdings(held, sub, f"{prefix}{node_id}.")


def _check_shared(m: nn.Module, frozen: Mapping[str, nn.Module]) -> None:
    """A module held by a frozen node and by a trainable one cannot be both frozen and
    trained: freezing would silently win, and the trainable node never train."""
    owner = {id(p): path for path, held in frozen.items() for p in held.parameters()}
    for name, p in m.named_parameters(remove_duplicate=False):
        path = owner.get(id(p))
        if path is not None and not any(name.startswith(f"{f}.") for f in frozen):
            node = name.split(".", 1)[0]
            raise StateError(
                f"node {path!r} is frozen and node {node!r} is not, but they hold the same "
                f"module (its parameter {name!r}): it cannot be both frozen and trained. Give "
                f"the frozen node its own copy (copy.deepcopy(module)), freeze {node!r} too, "
                f"or unfreeze {path!r} (g.freeze({path.split('.')[0]!r}, False))"
            )


def _signature(g: Graph) -> list[Any]:
    """What every node of ``g`` (subgraphs' too) holds, as ids, flat: each node's id, then
    what ``node_signature`` appends for it (a node's) or its ``holdings_signature`` (a
    subgraph's, a mapped node's). Nothing a node appends is a string but its attributes'
    names, each followed by a part that is not, so no two holdings read the same."""
    out: list[Any] = []
    put = out.append
    for n, impl in g._impls.items():
        put(n)
        if isinstance(impl, Node) and not isinstance(impl, Mapped):
            node_signature(impl, out)
        else:
            put(_signature(impl) if isinstance(impl, Graph) else holdings_signature(impl))
    return out


# parameter -> the modules (alive) whose graphs froze it. A node two graphs hold is one set
# of parameters, and requires_grad is the tensor's: it stays frozen while the module of any
# graph freezing it is alive, and the others' modules leave it so (each unfreezes only what
# no other module freezes). A module's claim goes with it: dropped, nothing enforces it.
_freezers: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _freezes(p: nn.Parameter, m: nn.Module) -> None:
    """Record that ``m``'s graph froze ``p``."""
    modules = _freezers.get(p)
    if modules is None:
        modules = _freezers[p] = weakref.WeakSet()
    modules.add(m)


def _others_freezing(p: nn.Parameter, m: nn.Module) -> list[Any]:
    """The modules other than ``m`` whose graphs freeze ``p``, each brought up to date first
    (a graph unfrozen since its module last registered it lets go of ``p`` then)."""
    modules = _freezers.get(p)
    for other in list(modules or ()):
        if other is not m:
            other._fresh()
    return [o for o in modules or () if o is not m]


def _frozen_by_another(p: nn.Parameter, m: nn.Module) -> bool:
    """Forget that ``m``'s graph froze ``p``; whether another module's graph still does."""
    modules = _freezers.get(p)
    if modules is not None:
        modules.discard(m)
    return bool(_others_freezing(p, m))


def _settle_frozen(m: nn.Module) -> None:
    """Before ``m``'s trainable parameters are read: a parameter this graph freezes is frozen
    again if something turned it on since (``model.requires_grad_(True)``, a GAN's toggle
    of a whole module); a parameter of a node trainable in its
    graph that freezing marked is unfrozen when no other module's graph freezes it any more
    (that module dropped or its node unfrozen), and an error while one does — it would
    silently not train here.

    Raises:
        StateError: naming the node, the parameter and the fixes.
    """
    for name, p in m.named_parameters():
        if not getattr(p, "_somatize_frozen", False):
            continue
        mine = _freezers.get(p)
        if mine is not None and m in mine:  # (frozen by this graph)
            if p.requires_grad:  # turned on since, by a module-wide requires_grad_(True)
                p.requires_grad_(False)
            continue
        if p.requires_grad:
            continue
        others = _others_freezing(p, m)
        if not others:
            p.requires_grad_(True)
            vars(p).pop("_somatize_frozen", None)  # (unless the other's sync just did)
            continue
        node = name.split(".", 1)[0]
        raise StateError(
            f"node {node!r} is trainable in this graph, but another graph holding the same "
            f"module ({others[0].graph!r}) froze it (its parameter {name!r}), and a parameter "
            f"frozen is frozen in every graph holding it: it would not train here. Freeze it "
            f"here too (g.freeze({node!r})), unfreeze it in the other graph (other.freeze(id, "
            f"False)), or give each graph its own copy of the node (copy.deepcopy(node))"
        )
