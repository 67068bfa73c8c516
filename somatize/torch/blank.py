"""``nn.Module`` instances made at the cost of a dict: ``blank(cls)``, and ``lazy(cls)``.

``nn.Module.__init__`` fills an instance with about seventeen attributes — the training
flag and a dozen empty containers (parameters, buffers, children, hooks) — through
``super().__setattr__``: several µs, the largest cost of registering one node in
``module(g)``. ``blank(cls)`` makes the same instance without it: what a plain
``nn.Module()`` holds is read once (from a real instance of the installed torch), and each
blank instance gets a copy in which every container is a fresh, empty one of the same
type, so no two modules ever share a hook table or a parameter dict.

A class decorated with ``lazy`` goes further: its blank instances hold only their mode,
parameters, buffers and children (what ``nn.Module``'s ``__setattr__`` and ``register_*``
look for in the instance dict). Every other container — the eleven hook tables and the
set of non-persistent buffers — is a class-level descriptor that makes the instance's
own empty container on first touch and stores it in the instance dict, where every
later read finds it; constants (``_is_full_backward_hook``) are class attributes. A
module that is never hooked, as ``module(g)``'s per-node modules are not, never makes
them: a third of ``module(g)``'s time at 1,000 nodes, and fewer fresh pages at 10,000.

Only attributes whose copy is understood are copied: ``dict``, ``OrderedDict`` and ``set``
(made empty), and immutable constants (``None``, booleans, numbers, strings). Should a
torch version give ``nn.Module`` anything else, ``blank`` calls ``cls()`` instead (the
ordinary constructor) and ``lazy`` leaves the class as it is.
``tests/torch/test_module_blank.py`` checks, attribute for attribute, that a blank module
(lazy or not) equals one constructed normally.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["blank", "lazy", "maker"]

M = TypeVar("M", bound=nn.Module)

_EMPTY: dict[type, str] = {dict: "{}", OrderedDict: "_OrderedDict()", set: "set()"}
_CONSTANT = (type(None), bool, int, float, str)
#: what a lazy class's instances still hold themselves: nn.Module.__setattr__ and
#: register_buffer/register_parameter read these from the instance dict
_OWN = ("training", "_parameters", "_buffers", "_modules")


def _probe() -> dict[str, Any] | None:
    """A plain ``nn.Module()``'s attributes, or None when one of them is of a kind this does
    not know how to copy."""
    probe = vars(nn.Module())
    for name, value in probe.items():
        if type(name) is not str or not name.isidentifier():
            return None
        if not (type(value) in _EMPTY and not value) and type(value) not in _CONSTANT:
            return None
    return probe


def _recipe(
    keep: tuple[str, ...] | None = None, cls: type[Any] | None = None, extra: tuple[str, ...] = ()
) -> Callable[..., Any] | None:
    """A function ``cls -> instance`` copying a plain ``nn.Module()``'s attributes (those in
    ``keep`` only, if given), or None when ``_probe`` finds one it cannot copy. Given
    ``cls``, the function makes instances of it, taking the values of ``extra`` (more
    instance attributes) as its arguments."""
    probe = _probe()
    if probe is None or not all(name.isidentifier() for name in extra):
        return None
    items = []
    for name, value in probe.items():
        if name in extra:  # given (a children table filled beforehand), in its usual place
            items.append(f"{name!r}: {name}")
        elif keep is None or name in keep:
            kind = type(value)
            items.append(f"{name!r}: {_EMPTY[kind]}" if kind in _EMPTY else f"{name!r}: {value!r}")
    items += [f"{name!r}: {name}" for name in extra if name not in probe]
    # A dict display evaluates each fresh container in C: a third of a loop's cost.
    source = (
        f"def blank({'cls' if cls is None else ', '.join(extra)}):\n"
        f"    instance = _new({'cls' if cls is None else '_cls'})\n"
        f"    _setattr(instance, '__dict__', {{{', '.join(items)}}})\n"
        "    return instance\n"
    )
    scope: dict[str, Any] = {
        "_new": object.__new__,
        "_setattr": object.__setattr__,
        "_OrderedDict": OrderedDict,
        "_cls": cls,
    }
    exec(compile(source, "<somatize.torch.blank>", "exec"), scope)  # (the source: built above)
    made: Callable[..., Any] = scope["blank"]
    return made


_made = _recipe()
_made_lazy = _recipe(_OWN)
_LAZY: set[type] = set()  # classes decorated with lazy (not their subclasses: made in full)


class _Lazy:
    """A container ``nn.Module.__init__`` would make, made on an instance's first touch.

    A non-data descriptor: once made, the container sits in the instance dict, which
    attribute lookup reads before it; assigning the attribute writes there too."""

    __slots__ = ("make", "name")

    def __init__(self, name: str, make: type) -> None:
        self.name, self.make = name, make

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        made = instance.__dict__[self.name] = self.make()
        return made


def lazy(cls: type[M]) -> type[M]:
    """Class decorator: ``blank(cls)`` instances make their hook tables on first touch.

    Example:
        >>> @lazy
        ... class Box(nn.Module): pass
        >>> b = blank(Box)
        >>> "_forward_hooks" in vars(b), len(b._forward_hooks), "_forward_hooks" in vars(b)
        (False, 0, True)
    """
    probe = _probe()
    if probe is None or _made_lazy is None:
        return cls  # blank(cls) falls back to cls() (every attribute made by __init__)
    for name, value in probe.items():
        if name not in _OWN:
            setattr(cls, name, _Lazy(name, type(value)) if type(value) in _EMPTY else value)
    _LAZY.add(cls)
    return cls


def blank(cls: type[M]) -> M:
    """A new instance of the ``nn.Module`` subclass ``cls`` as ``nn.Module.__init__`` leaves
    it, without running ``cls.__init__`` (the caller sets what ``cls`` adds).

    Example:
        >>> m = blank(nn.Module)
        >>> m.training, dict(m._parameters), m._forward_hooks is blank(nn.Module)._forward_hooks
        (True, {}, False)
    """
    made = _made_lazy if cls in _LAZY else _made
    if made is None:
        return cls()
    instance: M = made(cls)
    return instance


def maker(cls: type[M], *extra: str) -> Callable[..., M]:
    """A function making ``blank(cls)`` instances that also hold the attributes ``extra``,
    given as its arguments: ``maker(C, "a", "b")(1, 2)`` is ``blank(C)`` with ``a=1, b=2``
    in its instance dict, at the cost of one dict display. An ``extra`` that
    ``nn.Module.__init__`` makes too (``"_modules"``) is given instead of made: the caller
    passes a fresh container of the same type.

    Example:
        >>> @lazy
        ... class Tagged(nn.Module): pass
        >>> make = maker(Tagged, "tag")
        >>> m = make("x")
        >>> m.tag, m.training, dict(m._modules)
        ('x', True, {})
    """
    made = _recipe(_OWN if cls in _LAZY else None, cls, extra)
    if made is not None:
        return made

    def fallback(*values: Any) -> M:  # (cls() when blank cannot copy this torch's nn.Module)
        instance = blank(cls)
        vars(instance).update(zip(extra, values))
        return instance

    return fallback
