"""A method each instance runs from a copy of its code: ``GraphModule.forward``.

``torch.compile`` keeps the code it compiled, and counts recompiles toward its limit
(``torch._dynamo.config.recompile_limit``, 8), per *code object*. A plain module's compiled
forward serves every instance of its class; a graph's is guarded on that graph's own
objects (its program, its nodes). So the graphs of a sweep in one process — a seed or
learning-rate sweep with ``Options(compile=...)`` — shared one code object and one limit:
after 8 runs dynamo gave up, and the rest ran eagerly, said only in a log line. With a copy
of the code per module, each graph compiles once, under a limit of its own, and what was
compiled for it goes with the module.

The copy is of a one-line function that calls the class's method, bound to a *weak*
reference to the instance: the instance holds its method, and a method bound to the instance
itself would make a cycle (instance -> method -> instance) that only the cyclic collector
frees — and with it, for ``module(g)``, the graph and every weight it holds, a fit's worth
in a sweep, up to a young-generation collection later. Dynamo reads through the reference
(it guards that it is alive) and inlines the method.
"""

from __future__ import annotations

import types
import weakref
from typing import Any

__all__ = ["give_own_code", "without_own_code"]


def _calling(method: Any) -> Any:
    def call(ref: Any, *args: Any) -> Any:  # the code copied per instance
        obj = ref()
        if obj is None:
            raise ReferenceError(
                f"{method.__qualname__} was called through a method kept after its object was "
                "dropped (fn = model.forward; del model): keep the model, and call it"
            )
        if len(args) == 1:  # (a plain call: f(*args) costs 3x this call's own overhead)
            return method(obj, args[0])
        return method(obj, *args)

    return call


def give_own_code(obj: Any, name: str) -> None:
    """Bind to ``obj``, as its attribute ``name``, its class's method run through a copy of
    a small function's code of its own. A plain attribute: no descriptor runs (dynamo would
    compile that frame too, and recompile it per copy). Bound to a weak reference to ``obj``:
    no cycle, so ``obj`` is freed when its last reference goes."""
    f = getattr(type(obj), name)
    call = _calling(f)
    own = types.FunctionType(
        call.__code__.replace(), call.__globals__, f.__name__, None, call.__closure__
    )
    own.__qualname__, own.__doc__, own.__module__ = f.__qualname__, f.__doc__, f.__module__
    own.__wrapped__ = f  # type: ignore[attr-defined]  # (inspect.signature reads the method's)
    object.__setattr__(obj, name, types.MethodType(own, weakref.ref(obj)))


def without_own_code(state: dict[str, Any], name: str) -> dict[str, Any]:
    """``state`` (an instance's ``__getstate__``) without its copy, a function pickle cannot
    name: made again when unpickled."""
    state.pop(name, None)
    return state
