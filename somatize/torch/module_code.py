"""The code of modules that do not run their class's Python: TorchScript and torch.fx.

A ``torch.jit.script``ed or traced module (saved and loaded too) runs TorchScript, and a
``torch.fx.GraphModule`` the Python generated from its graph; their classes are torch's
(``RecursiveScriptModule``, ``GraphModuleImpl``) and enter a fingerprint by name, so two
exports of two versions of an encoder holding the same weights had one fingerprint. Here:

* a TorchScript module enters by the code of its methods (``_c.code``: all of them),
  with the constants a trace folded into it (``CONSTANTS.c0``: ``self.k`` as it was),
  and where it calls functions of its own (``helper(x)``, not torch's) by the graphs of
  its methods with them inlined. That is read once per instance (a few hundred µs; its
  code cannot change); its attributes (``self.k`` a script reads, changed by
  ``s.k = 5.0``) are read at every key, as a module's settings are;
* a GraphModule enters by its generated code (``_code``, remade by ``recompile()``) and
  its own attributes (the tensors a trace made constants), as settings
  (``fingerprints._names``);
* a ``torch.jit.ScriptFunction`` a node or module holds, by its inlined graph.

Names that TorchScript mangles per process (``___torch_mangle_3``) and the source
locations in graphs are left out, so one export read in two processes has one key.
"""

from __future__ import annotations

import re
import sys
import weakref
from typing import TYPE_CHECKING, Any

import torch
from blake3 import blake3

from .tensor_keys import tensor_bytes

if TYPE_CHECKING:
    from .codecs import TensorCodec

__all__ = ["fx_names", "is_script", "script_function", "script_part"]

_MANGLED = re.compile(r"___torch_mangle_\d+\.")
_SOURCE = re.compile(r" # [^\n]*")  # (a graph line's source location)
_OWN_CALL = re.compile(r"__torch__\.(?!torch\.)[\w.]+\(")  # a function not torch's called
_SKIP = frozenset({"training", "_is_full_backward_hook"})  # (the mode enters on its own)
_SETTING = frozenset({int, float, bool, str, type(None)})
# id(module) -> (the module, weakly; the digest of its code; the names of its attributes)
_SCRIPTS: dict[int, tuple[weakref.ref[Any], str, tuple[str, ...]]] = {}
_FUNCTIONS: dict[int, tuple[weakref.ref[Any], str]] = {}  # id -> (weakly, its digest)
_SCRIPT_CLASSES: dict[type, bool] = {}


def is_script(cls: type) -> bool:
    """Whether modules of class ``cls`` run TorchScript (scripted, traced or loaded)."""
    known = _SCRIPT_CLASSES.get(cls)
    if known is None:
        known = _SCRIPT_CLASSES[cls] = issubclass(cls, torch.jit.ScriptModule)
    return known


def script_part(mod: Any, codec: TensorCodec) -> str:
    """What of a TorchScript module enters its fingerprint beside its weights, mode and
    hooks: the digest of its code (once per instance) and its attributes as they are now."""
    known = _SCRIPTS.get(id(mod))
    if known is None or known[0]() is not mod:
        if len(_SCRIPTS) >= 4096:  # forget modules that no longer exist
            for k in [k for k, v in _SCRIPTS.items() if v[0]() is None]:
                del _SCRIPTS[k]
        known = (weakref.ref(mod), _script_code(mod._c), _attribute_names(mod))
        if len(_SCRIPTS) < 4096:
            _SCRIPTS[id(mod)] = known
    _, code, names = known
    if not names:
        return code
    c = mod._c
    values = []
    for name in names:
        v = c.getattr(name)
        t = type(v)
        if t in _SETTING or (
            (t is list or t is tuple) and all(type(x) in _SETTING for x in v)
        ):  # (1 and 1.0, True and 1: apart by their repr; [0, 0] a conv's padding)
            values.append(f"{t.__name__}:{v!r}")
        elif isinstance(v, torch.Tensor):
            values.append(codec.digest(v))
        else:
            from .module_held import other_setting

            values.append(repr(other_setting(v, codec, mod, name)))
    return f"{code}:" + blake3("\0".join(values).encode()).hexdigest()


def _script_code(c: Any) -> str:
    """The digest of a TorchScript module's methods (``c`` its ``torch._C.ScriptModule``)."""
    code = c.code  # (the class: its attributes' types and all its methods)
    h = blake3(_MANGLED.sub("", code).encode())
    names = c._method_names()
    if "CONSTANTS." in code:  # a trace's constants (self.k, a tensor made in forward)
        for name in names:
            for k, v in sorted(c._get_method(name).code_with_constants[1].items()):
                h.update(f"\0{name}.{k}={_constant(v)}".encode())
    if _OWN_CALL.search(code):  # functions of its own: their code, inlined in the graphs
        for name in names:
            h.update(f"\0{name}:{_graph(c._get_method(name).inlined_graph)}".encode())
    return h.hexdigest()


def _attribute_names(mod: Any) -> tuple[str, ...]:
    """The attributes a TorchScript module keeps beside its parameters, buffers and
    submodules (``self.k``, ``self.n`` of a scripted module; none of a traced one)."""
    concrete = getattr(mod, "_concrete_type", None)
    if concrete is None:
        return ()
    tables = (mod._parameters, mod._buffers, mod._modules)
    found = concrete.get_attributes()
    return tuple(sorted(k for k in found if k not in _SKIP and not any(k in t for t in tables)))


def _constant(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor:{tuple(v.shape)}:{v.dtype}:{blake3(tensor_bytes(v)).hexdigest()}"
    return f"{type(v).__name__}:{v!r}"


def _graph(graph: Any) -> str:
    return _MANGLED.sub("", _SOURCE.sub("", str(graph)))


def script_function(fn: Any) -> str:
    """A ``torch.jit.ScriptFunction``'s fingerprint: its graph, with what it calls inlined."""
    known = _FUNCTIONS.get(id(fn))
    if known is not None and known[0]() is fn:
        return known[1]
    result = "script:" + blake3(_graph(fn.inlined_graph).encode()).hexdigest()
    if len(_FUNCTIONS) >= 1024:
        _FUNCTIONS.clear()
    _FUNCTIONS[id(fn)] = (weakref.ref(fn), result)
    return result


_FX_OWN: frozenset[str] | None = None  # what torch.fx sets on every GraphModule


def fx_names(cls: type, d: dict[str, Any]) -> tuple[str, ...] | None:
    """The attributes of a ``torch.fx.GraphModule`` that enter as settings — its generated
    code (``_code``) and what it keeps of its own (the constants a trace made, its public
    attributes) —, or None where ``cls`` is no GraphModule."""
    global _FX_OWN
    fx = sys.modules.get("torch.fx")
    if fx is None or not issubclass(cls, fx.GraphModule):
        return None
    if _FX_OWN is None:
        _FX_OWN = frozenset(fx.GraphModule(torch.nn.Module(), fx.Graph()).__dict__) - {"_code"}
    return tuple(k for k in d if k not in _FX_OWN and k != "_compiled_call_impl")
