"""A method each instance runs from a copy of its code: ``GraphModule.forward``.

``torch.compile`` keeps the code it compiled, and counts recompiles toward its limit
(``torch._dynamo.config.recompile_limit``, 8), per *code object*. A plain module's compiled
forward serves every instance of its class; a graph's is guarded on that graph's own
objects (its program, its nodes). So the graphs of a sweep in one process — a seed or
learning-rate sweep with ``Options(compile=...)`` — shared one code object and one limit:
after 8 runs dynamo gave up, and the rest ran eagerly, said only in a log line. With a copy
of the code per module, each graph compiles once, under a limit of its own, and what was
compiled for it goes with the module.
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["give_own_code", "without_own_code"]


def give_own_code(obj: Any, name: str) -> None:
    """Bind to ``obj``, as its attribute ``name``, its class's method run from a copy of
    its code. A plain attribute: no descriptor runs (dynamo would compile that frame too,
    and recompile it per copy). It makes a cycle, obj -> method -> obj, which the
    collector frees."""
    f = getattr(type(obj), name)
    own = types.FunctionType(
        f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__
    )
    own.__qualname__, own.__doc__, own.__module__ = f.__qualname__, f.__doc__, f.__module__
    own.__kwdefaults__ = f.__kwdefaults__
    object.__setattr__(obj, name, types.MethodType(own, obj))


def without_own_code(state: dict[str, Any], name: str) -> dict[str, Any]:
    """``state`` (an instance's ``__getstate__``) without its copy, a function pickle cannot
    name: made again when unpickled."""
    state.pop(name, None)
    return state
