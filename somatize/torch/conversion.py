"""``module(g).to(...)``: what a conversion of a graph's module keeps of freezing.

``.to()``, ``.double()``, ``.half()``, ``.cuda()`` and the rest go through
``nn.Module._apply``, which converts each parameter one of three ways: in place
(``param.data = ...``, torch's default), by ``torch.utils.swap_tensors`` (under
``torch.__future__.set_swap_module_params_on_conversion(True)``: the same Python object, its
attributes dropped), or by a new parameter in its place (under
``torch.__future__.set_overwrite_module_params_on_conversion(True)``). The mark freezing
left on a frozen node's parameter, and the claims of the modules freezing it
(``freezers.py``), follow it whichever way, also when the conversion fails part way.

Nothing of somatize holds a weak reference to a tensor, which ``swap_tensors`` refuses:
the digest memo holds the tensors (``tensor_memo.py``), the freezing records their ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from .freezers import _moved, marked

__all__: list[str] = []


def convert(m: nn.Module, apply: Callable[[], Any]) -> None:
    """Run ``apply`` (``nn.Module._apply`` over ``m``); each parameter freezing marked before
    is marked after, and the claims on it are on what took its place."""
    before = {name: p for name, p in m.named_parameters() if marked(p)}
    try:
        apply()
    finally:
        if before:
            after = dict(m.named_parameters())
            for name, p in before.items():
                _moved(p, after.get(name, p))
