"""``nn.Module`` instances made at the cost of a dict: ``blank(cls)``.

``nn.Module.__init__`` fills an instance with about seventeen attributes — the training
flag and a dozen empty containers (parameters, buffers, children, hooks) — through
``super().__setattr__``: several µs, the largest cost of registering one node in
``module(g)``. ``blank(cls)`` makes the same instance without it: what a plain
``nn.Module()`` holds is read once (from a real instance of the installed torch), and each
blank instance gets a copy in which every container is a fresh, empty one of the same
type, so no two modules ever share a hook table or a parameter dict.

Only attributes whose copy is understood are copied: ``dict``, ``OrderedDict`` and ``set``
(made empty), and immutable constants (``None``, booleans, numbers, strings). Should a
torch version give ``nn.Module`` anything else, ``blank`` calls ``cls()`` instead (the
ordinary constructor). ``tests/torch/test_module_blank.py`` checks, attribute for
attribute, that a blank module equals one constructed normally.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["blank"]

M = TypeVar("M", bound=nn.Module)

_EMPTY: dict[type, str] = {dict: "{}", OrderedDict: "_OrderedDict()", set: "set()"}
_CONSTANT = (type(None), bool, int, float, str)


def _recipe() -> Callable[[type[Any]], Any] | None:
    """A function ``cls -> instance`` copying a plain ``nn.Module()``'s attributes, or None
    when one of them is of a kind this does not know how to copy."""
    probe = vars(nn.Module())
    items = []
    for name, value in probe.items():
        if type(name) is not str or not name.isidentifier():
            return None
        kind = type(value)
        if kind in _EMPTY and not value:
            items.append(f"{name!r}: {_EMPTY[kind]}")
        elif kind in _CONSTANT:
            items.append(f"{name!r}: {value!r}")
        else:
            return None
    # A dict display evaluates each fresh container in C: a third of a loop's cost.
    source = (
        "def blank(cls):\n"
        "    instance = _new(cls)\n"
        f"    _setattr(instance, '__dict__', {{{', '.join(items)}}})\n"
        "    return instance\n"
    )
    scope: dict[str, Any] = {
        "_new": object.__new__,
        "_setattr": object.__setattr__,
        "_OrderedDict": OrderedDict,
    }
    exec(compile(source, "<somatize.torch.blank>", "exec"), scope)  # (the source: built above)
    made: Callable[[type[Any]], Any] = scope["blank"]
    return made


_made = _recipe()


def blank(cls: type[M]) -> M:
    """A new instance of the ``nn.Module`` subclass ``cls`` as ``nn.Module.__init__`` leaves
    it, without running ``cls.__init__`` (the caller sets what ``cls`` adds).

    Example:
        >>> m = blank(nn.Module)
        >>> m.training, dict(m._parameters), m._forward_hooks is blank(nn.Module)._forward_hooks
        (True, {}, False)
    """
    if _made is None:
        return cls()
    instance: M = _made(cls)
    return instance
