"""A module's fingerprint: its structure, modes, settings, hooks and tensor digests.

``TensorCodec.fingerprint(module)`` is asked for on every key of a node holding modules —
a frozen backbone's, every batch — so that a changed weight, mode or setting is never
served a stale entry. It is made of each submodule's name, class (for the user's own
classes, also the fingerprint of their code; for TorchScript and torch.fx modules, the code
they run, ``module_code``), mode, plain attributes (``negative_slope``,
``eps``) and forward hooks, the digest of each parameter and buffer (memoised by version
counter), and torch's global forward hooks. When all of those equal what the module's
last fingerprint was made of, type for type (``1`` and ``1.0`` are equal, not the same
setting), that fingerprint is returned without hashing anything.

What that check costs is a walk of the modules: per tensor one read of its version,
address, dtype, shape and strides against the codec's memo, per module its table of
children, its plain attributes (compared by identity while they are the very numbers,
strings and tuples of them found last time) and its hook tables, with no Python call per
tensor (a
150-module, 350-tensor backbone: 435–465 µs per batch, measured, against 494 µs walking
``named_modules`` and calling ``digest`` per tensor).
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable
from operator import is_, itemgetter
from typing import TYPE_CHECKING, Any

import torch
from blake3 import blake3
from torch import nn

from ..bindings import Watched, still, watch
from ..class_data import class_data
from ..held_values import value_kind
from ..identity import _is_user_module
from ..identity import fingerprint as fingerprint_code
from ..values import digest as digest_data
from .module_code import fx_names, is_script, script_part
from .module_held import hooks_of, other_setting

if TYPE_CHECKING:
    from .codecs import TensorCodec

__all__ = ["module_fingerprint"]

_NO_EXTRA = nn.Module.get_extra_state
_global_hooks = (  # (torch's own dicts, mutated in place when a global hook is registered)
    nn.modules.module._global_forward_pre_hooks,
    nn.modules.module._global_forward_hooks,
)
_SETTING = frozenset({int, float, bool, str, type(None)})
_CLASS_IDS: dict[type, str] = {}  # a library class's name; a user class's below
# a user class -> its name and code fingerprint, and the names its code reads (bindings.py)
_USER_IDS: dict[type, tuple[str, Watched]] = {}
# (class, size of __dict__) -> (the names of its settings, the other attributes left out)
_PUBLIC: dict[tuple[type, int], tuple[tuple[str, ...], tuple[str, ...]]] = {}
# What nn.Module.__init__ sets, in every instance: tables and hooks, entered on their own;
# and what .compile() adds to an instance, not a setting either
_ALWAYS = frozenset(nn.Module().__dict__)
_MODULE_OWN = _ALWAYS | {"_compiled_call_impl"}
_PLAIN_TUPLES: set[tuple[Any, ...]] = set()  # tuples of plain values seen: (3, 3), (1, 1)
# (names, values, their types): a module's settings, as ``_settings`` gives them
_Settings = tuple[tuple[str, ...], list[Any], tuple[Any, ...]]
# a module -> (itself, weakly; the size of its __dict__; a reader of its settings and left-out
# attributes; what it read; the settings they made), kept while all are immutable (_keep)
_LAST: dict[int, tuple[Any, int, Callable[[Any], Any], Any, _Settings]] = {}


def module_fingerprint(codec: TensorCodec, obj: nn.Module) -> str:
    """The fingerprint of ``obj`` (see the module docstring), from ``codec``'s memos."""
    # hooks every module runs, then per module: name, class, mode, parameter and buffer
    # digests, plain attributes, forward hooks
    parts: list[tuple[Any, ...]] = [
        hooks_of(codec, None, *_global_hooks) if _global_hooks[0] or _global_hooks[1] else ()
    ]
    extra = False
    digest, known = codec.digest, codec._memo.get
    classes: dict[type, str] = {}  # (a user class's id, checked once per walk)
    modules = _named_modules(obj)
    for name, mod in modules:
        held: list[tuple[str, str]] = []
        if mod._parameters:
            _digests(mod._parameters, held, known, digest, False)
        if mod._buffers:
            # Batch norm updates its running statistics in place without moving their
            # version counter: buffers of a module in training mode are always hashed.
            _digests(mod._buffers, held, known, digest, mod.training)
        cls = type(mod)
        hooks = (
            hooks_of(codec, mod, mod._forward_pre_hooks, mod._forward_hooks)
            if mod._forward_pre_hooks or mod._forward_hooks
            else ()
        )
        cls_id = _CLASS_IDS.get(cls) or classes.get(cls)
        if cls_id is None:  # (a user class: rechecked, once per walk; a TorchScript one:
            # read per instance, its code is the instance's)
            cls_id = _class_id(cls, mod, codec)
            if not is_script(cls):
                classes[cls] = cls_id
        parts.append((name, cls_id, mod.training, held, _settings(mod, codec), hooks))
        if cls.get_extra_state is not _NO_EXTRA:
            extra = True
    memo = codec._modules.get(id(obj))
    if not extra and memo is not None and memo[0]() is obj and memo[1] == parts:
        return memo[2]
    result = _hash(codec, parts, modules)
    if not extra:
        codec._remember_module(obj, parts, result)
    return result


def _hash(codec: TensorCodec, parts: list[tuple[Any, ...]], modules: list[Any]) -> str:
    h = blake3()
    if parts[0]:
        h.update(f"global hooks={parts[0]!r}\0".encode())
    for (name, cls, training, held, settings, hooks), (_, mod) in zip(parts[1:], modules):
        h.update(f"{name}:{cls}:{training}\0".encode())
        for pname, d in held:
            h.update(f"{name}.{pname}={d}\0".encode())
        for key, value in zip(settings[0], settings[1]):
            h.update(f"{name}.{key}={value!r}\0".encode())
        if hooks:
            h.update(f"{name} hooks={hooks!r}\0".encode())
        if type(mod).get_extra_state is not _NO_EXTRA:
            # extra state may change with no tensor moving: never served from the memo
            state = digest_data(mod.get_extra_state(), (codec,), f"the extra state of {name!r}")
            h.update(f"{name}._extra_state={state}\0".encode())
    return h.hexdigest()


def _named_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """``list(root.named_modules())`` — the same names, order and deduplication — by a
    loop over the children tables instead of nested generators."""
    out: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    todo: list[tuple[str, nn.Module]] = [("", root)]
    pop, put = todo.pop, out.append
    while todo:
        prefix, m = pop()
        if id(m) in seen:  # (a module reached twice: named where it is first reached)
            continue
        seen.add(id(m))
        put((prefix, m))
        children = m._modules
        if children:
            dot = prefix + "." if prefix else ""
            todo.extend(reversed([(dot + n, c) for n, c in children.items() if c is not None]))
    return out


def _digests(
    table: dict[str, Any],
    held: list[tuple[str, str]],
    known: Callable[[int], Any],
    digest: Callable[..., str],
    fresh: bool,
) -> None:
    """(name, digest) of each tensor of a parameter or buffer table, appended to ``held``:
    what ``digest`` returns, read from its memo here while the tensor's version, address,
    dtype, shape and strides are the memo's (no call per tensor)."""
    for name, t in table.items():
        if t is None:
            continue
        if not fresh:
            try:
                seen = (t._version, t.data_ptr(), t.dtype, t.shape, t.stride())
            except RuntimeError:  # (inference-mode tensors: digest hashes them every time)
                pass
            else:
                m = known(id(t))
                if m is not None and m[1] == seen and m[0] is t:
                    held.append((name, m[2]))
                    continue
        held.append((name, digest(t, fresh=fresh)))


def _class_id(cls: type, mod: nn.Module, codec: TensorCodec | None = None) -> str:
    """How a module's class enters a fingerprint: its name; and, when it is the user's own
    class (not a library's, which enters by version), the fingerprint of its code, read
    again when a name its code reads is bound anew (a helper redefined in a notebook) or its
    code changes in place (a method patched, ``%autoreload 2``: ``bindings.still``), and
    the data its classes hold (``K = 2.0``, ``T = torch.tensor(...)``: by value, a tensor by
    ``codec``'s digest, an array by the numpy codec joined to it), read at every key as a
    node class's is (``class_data.py``); for
    a TorchScript module, the code it runs and its attributes (``module_code``)."""
    if is_script(cls) and codec is not None:  # (never kept: asked of each instance per key)
        return f"{cls.__qualname__}:{script_part(mod, codec)}"
    known = _USER_IDS.get(cls)
    if known is None or not still(known[1]):
        name = cls.__qualname__
        if not _is_user_module(sys.modules.get(cls.__module__)):
            if len(_CLASS_IDS) < 4096:
                _CLASS_IDS[cls] = name
            return name
        known = f"{cls.__module__}.{name}:{fingerprint_code(cls)}", watch(cls, ())
        if len(_USER_IDS) < 4096:
            _USER_IDS[cls] = known
    # (with the codecs the graph joined to ``codec``: a class's numpy array too)
    data = class_data(cls, codec._held_codes().codecs if codec is not None else ())
    return known[0] if data is None else f"{known[0]}:{data}"


def _settings(mod: nn.Module, codec: TensorCodec) -> _Settings:
    """A module's plain attributes (``LeakyReLU.negative_slope``, ``BatchNorm.eps``): the
    names of its public instance attributes (a user module's private ones too, see
    ``_names``) and their values, numbers, strings and tuples of them as they are, tensors
    by digest.

    The names are found once per class and size of the instance's ``__dict__``, with the
    attributes left out beside those ``nn.Module.__init__`` sets (a library module's
    private ones, and ``.compile()``'s ``_compiled_call_impl``, which only a compiled
    instance has): an instance of that size holding all of both has the same attributes
    (``nn.Module.__init__``'s are in every instance); one missing any is a ``KeyError``, and
    the names are found again. (An instance with a private attribute, or compiled, and
    another, of the same size, with a public one in its place are told apart.)

    The third item is the values' types (inside tuples too): a fingerprint's memo compares
    parts with ``==``, which holds ``1 == 1.0 == True`` and ``0.0 == -0.0``; their types
    (``-0.0`` marked) tell them apart."""
    d = mod.__dict__
    last = _LAST.get(id(mod))
    if last is not None and last[0]() is mod and len(d) == last[1]:
        try:
            if all(map(is_, last[2](d), last[3])):
                return last[4]  # the very objects of last time, all immutable: as they were
        except KeyError:  # (an attribute of last time is gone)
            pass
    shape = (type(mod), len(d))
    known = _PUBLIC.get(shape)
    try:
        if known is None:
            raise KeyError
        names, left = known
        if left:
            for k in left:
                d[k]
        values = [d[k] for k in names]
    except KeyError:
        names = _names(type(mod), d)
        left = tuple(k for k in d if k not in _ALWAYS and k not in names)
        if len(_PUBLIC) < 4096:
            _PUBLIC[shape] = names, left
        values = [d[k] for k in names]
    if _SETTING.issuperset(map(type, values)):  # (numbers and flags only: as they are)
        return _keep(mod, names, left, (names, values, tuple(map(_typed, values))))
    plain_only = True
    for i, v in enumerate(values):
        t = type(v)
        if t not in _SETTING and not (t is tuple and _seen_plain(v)):
            values[i] = (
                codec.digest(v)
                if isinstance(v, torch.Tensor)
                else other_setting(v, codec, mod, names[i])
            )
            plain = t is tuple and all(type(x) in _SETTING for x in v)
            if plain and len(_PLAIN_TUPLES) < 4096:
                _PLAIN_TUPLES.add(v)
            # (an immutable value, a numpy float: by value, and as immutable as a number)
            plain_only = plain_only and (plain or value_kind(t) is not None)
    kinds = tuple([_typed(v) for v in values])
    return _keep(mod, names, left, (names, values, kinds)) if plain_only else (names, values, kinds)


def _seen_plain(v: tuple[Any, ...]) -> bool:
    """Whether ``v`` is a tuple of plain values seen before; False for one that cannot be
    hashed (a list in it: ``([3, 3], 1)``), which is then read item by item."""
    try:
        return v in _PLAIN_TUPLES
    except TypeError:
        return False


def _typed(v: Any) -> Any:
    """The type of ``v``, and inside tuples and lists, of each item's (a held object's plain
    settings: ``("obj:Config", (("scale", 1),))``)."""
    t = type(v)
    if t is float and not v and math.copysign(1.0, v) < 0:
        return "-0.0"  # (equal to 0.0, and not the same setting: 1 / x differs)
    return tuple([_typed(x) for x in v]) if t is tuple or t is list else t


def _keep(
    mod: nn.Module, names: tuple[str, ...], left: tuple[str, ...], made: _Settings
) -> _Settings:
    """Remember the settings ``made`` of a module's values that are only numbers, flags,
    strings and tuples of them (immutable): while its ``__dict__`` has the same size and holds
    the very same objects under those names and the left-out ones, its settings are these
    (``_settings``). Returns ``made``."""
    if len(_LAST) > 4096:
        _LAST.clear()
    d, read = mod.__dict__, (*names, *left)
    getter = itemgetter(*read) if len(read) > 1 else (lambda d: tuple(d[k] for k in read))
    _LAST[id(mod)] = (weakref.ref(mod), len(d), getter, getter(d), made)
    return made


def _names(cls: type, d: dict[str, Any]) -> tuple[str, ...]:
    """The attributes of a module that enter as settings: the public ones; and, for the
    user's own classes, the private ones too (``self._scale`` read in ``forward``), but
    not the tables ``nn.Module`` keeps. (A library module's private attributes are what
    its constructor made of its public ones.)"""
    if is_script(cls):  # (its attributes are TorchScript's: read with its code)
        return ()
    generated = fx_names(cls, d)  # a torch.fx GraphModule: its code and its own attributes
    if generated is not None:
        return generated
    if not _is_user_module(sys.modules.get(cls.__module__)):
        return tuple(k for k in d if k[0] != "_" and k != "training")
    return tuple(
        k for k in d if k != "training" and k not in _MODULE_OWN and not k.startswith("_somatize")
    )
