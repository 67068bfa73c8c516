"""Which modules freeze which parameters: the claims a graph's module holds on the
parameters of its frozen nodes, and the mark freezing leaves on a parameter.

A node two graphs hold is one set of parameters, and ``requires_grad`` is the tensor's: it
stays frozen while the module of any graph freezing it is alive, and the others' modules
leave it so (each unfreezes only what no other module freezes). A module's claim goes with
it: dropped, nothing enforces it. Freezing marks a parameter it turned off
(``_somatize_frozen``), so unfreezing gives back only what freezing took.

No record here refers to a parameter weakly: ``torch.utils.swap_tensors`` — what
``.to()``, ``.double()`` and ``.cuda()`` do under
``torch.__future__.set_swap_module_params_on_conversion(True)`` — refuses a tensor that has
a weak reference. A swap keeps the parameter (the same Python object) and drops its
attributes, the mark among them: a parameter a live module claims counts as marked, and is
marked again when that module converts it, registers it again, or is dropped.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from torch import nn

from ..errors import StateError

__all__ = ["freeze", "frozen_any", "marked"]

MARK = "_somatize_frozen"  # set on a parameter freezing turned requires_grad off for

# id(parameter) -> the modules (alive) whose graphs freeze it. Each of those modules holds
# the parameter in its claims (``_claims``), so an id whose set is not empty names that
# parameter, alive, and no other object.
_freezers: dict[int, weakref.WeakSet[Any]] = {}  # (GraphModules)
_limit = [4096]  # entries before those of parameters no module claims are dropped
_marked = [False]  # whether any parameter was ever marked frozen (in this process)


def frozen_any() -> bool:
    """Whether any parameter was ever marked frozen in this process: until one was, none
    needs ``_settle_frozen``'s walk."""
    return _marked[0]


def marked(p: nn.Parameter) -> bool:
    """Whether freezing turned ``p``'s requires_grad off: its mark, or a live module's
    claim (a swap, ``torch.utils.swap_tensors``, drops the mark with the attributes)."""
    return getattr(p, MARK, False) or bool(_freezers.get(id(p)))


def _claims(m: nn.Module) -> dict[int, nn.Parameter]:
    """id -> parameter, for each parameter ``m``'s graph freezes (held: see ``_freezers``)."""
    claims: dict[int, nn.Parameter] | None = vars(m).get("_claims")
    if claims is None:
        claims = vars(m)["_claims"] = {}
        # (marks what it still claims when it goes: another graph's module unfreezes them)
        weakref.finalize(m, _mark_all, claims).atexit = False
    return claims


def _mark_all(claims: dict[int, nn.Parameter]) -> None:
    for p in claims.values():
        setattr(p, MARK, True)


def freeze(m: nn.Module, frozen: Mapping[str, nn.Module]) -> None:
    """Freeze the parameters of ``frozen`` (path -> holdings: ``m``'s graph's frozen nodes'),
    their modules put in eval mode, and give back what freezing took of ``m``'s others that
    no other module's graph freezes (each time ``m`` registers its nodes)."""
    still = {id(p) for held in frozen.values() for p in held.parameters()}
    if _marked[0]:  # (a walk over every parameter, only once something was frozen)
        for p in m.parameters():
            if id(p) not in still and marked(p):
                if _frozen_by_another(p, m):  # (a node this graph shares with another)
                    continue
                p.requires_grad_(True)
                vars(p).pop(MARK, None)  # (unless the other's sync just did)
        _release_gone(m, still)  # (a module replaced on a frozen node: not held)
    for held in frozen.values():
        for p in held.parameters():
            if p.requires_grad:  # marked, so unfreezing gives back only what freezing took
                p.requires_grad_(False)
                _freezes(p, m)
            elif marked(p):
                _freezes(p, m)
        held.eval()


def _freezes(p: nn.Parameter, m: nn.Module) -> None:
    """Mark ``p`` and record that ``m``'s graph froze it."""
    setattr(p, MARK, True)
    _marked[0] = True
    modules = _freezers.get(id(p))
    if modules is None:
        if len(_freezers) >= _limit[0]:  # (ids no live module claims: their modules went)
            for key in [k for k, v in _freezers.items() if not v]:
                del _freezers[key]
            _limit[0] = max(4096, 2 * len(_freezers))
        modules = _freezers[id(p)] = weakref.WeakSet()
    modules.add(m)
    _claims(m)[id(p)] = p


def _release(p: nn.Parameter, m: nn.Module) -> None:
    """Forget that ``m``'s graph froze ``p``."""
    modules = _freezers.get(id(p))
    if modules is not None:
        modules.discard(m)
    _claims(m).pop(id(p), None)


def _release_gone(m: nn.Module, kept: set[int]) -> None:
    """Forget ``m``'s claims on the parameters not in ``kept`` (ids), which its graph no longer
    holds (a module replaced on a node): claimed, they would stay alive with ``m``. Marked,
    another graph's module unfreezes them when none freezes them any more."""
    claims: dict[int, nn.Parameter] = vars(m).get("_claims") or {}
    for key in [k for k in claims if k not in kept]:
        p = claims[key]
        setattr(p, MARK, True)
        _release(p, m)


def _moved(p: nn.Parameter, q: nn.Parameter) -> None:
    """``q`` took ``p``'s place (``.to()`` making new parameters): the claims on ``p`` move
    to it, and its mark."""
    setattr(q, MARK, True)
    if q is p:
        return
    for m in list(_freezers.get(id(p)) or ()):
        _release(p, m)
        _freezes(q, m)


def _others_freezing(p: nn.Parameter, m: nn.Module) -> list[Any]:
    """The modules other than ``m`` whose graphs freeze ``p``, each brought up to date first
    (a graph unfrozen since its module last registered it lets go of ``p`` then)."""
    modules = _freezers.get(id(p))
    for other in list(modules or ()):
        if other is not m:
            other._fresh()
    return [o for o in modules or () if o is not m]


def _frozen_by_another(p: nn.Parameter, m: nn.Module) -> bool:
    """Forget that ``m``'s graph froze ``p``; whether another module's graph still does."""
    _release(p, m)
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
        if not marked(p):
            continue
        mine = _freezers.get(id(p))
        if mine is not None and m in mine:  # (frozen by this graph)
            if p.requires_grad:  # turned on since, by a module-wide requires_grad_(True)
                p.requires_grad_(False)
            continue
        if p.requires_grad:
            continue
        others = _others_freezing(p, m)
        if not others:
            p.requires_grad_(True)
            vars(p).pop(MARK, None)  # (unless the other's sync just did)
            continue
        node = name.split(".", 1)[0]
        raise StateError(
            f"node {node!r} is trainable in this graph, but another graph holding the same "
            f"module ({others[0].graph!r}) froze it (its parameter {name!r}), and a parameter "
            f"frozen is frozen in every graph holding it: it would not train here. Freeze it "
            f"here too (g.freeze({node!r})), unfreeze it in the other graph (other.freeze(id, "
            f"False)), or give each graph its own copy of the node (copy.deepcopy(node))"
        )
