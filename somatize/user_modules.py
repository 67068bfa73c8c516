"""Whose code and objects are whose: the user's own modules against the standard library,
installed packages and somatize itself (which enter a key by name and version), and the
attributes of an object of the user's. ``identity.py`` and ``node_state.py`` ask these
to decide how something enters a key."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
import sysconfig
import types
from typing import Any

__all__: list[str] = []


@functools.cache
def _versions() -> str:
    parts = []
    for dist in ("somatize", "torch"):
        try:
            parts.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist}=none")
    return " ".join(parts)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    roots.add(os.path.dirname(os.path.abspath(__file__)))  # somatize itself: enters by version
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def _is_user_module(module: types.ModuleType | None) -> bool:
    if module is None:
        return False
    file = getattr(module, "__file__", None)
    if file is None:
        return module.__name__ == "__main__"
    return not _in_library(file)


@functools.lru_cache(maxsize=8192)
def _in_library(file: str) -> bool:
    """Whether a module's file lies under the standard library, site-packages or somatize
    (kept per path: ``realpath`` costs six ``lstat`` calls, and keys ask at every miss)."""
    return os.path.realpath(file).startswith(_library_roots())


_DESCRIPTORS = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)


def _library_function(obj: Any) -> str | None:
    """``module.name`` of a library function that is not a Python one — a numpy ufunc or
    array-function dispatcher (``np.add``, ``np.dot``), a Cython function
    (``np.random.default_rng``), a builtin type's method (``str.lower``) — found under
    that name in its library module, as a library's Python function is known by its name;
    None for anything else (a library object's instance, even a callable one, has state).
    """
    if isinstance(obj, _DESCRIPTORS):
        owner = obj.__objclass__
        if _is_user_module(sys.modules.get(owner.__module__)):
            return None
        return f"{owner.__module__}.{obj.__qualname__}"
    if not callable(obj):
        return None
    module_name = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module_name, str) or not isinstance(name, str):
        return None
    module = sys.modules.get(module_name)
    if module is None or _is_user_module(module):
        return None
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    return f"{module_name}.{name}" if found is obj else None


def _has_attributes(obj: Any) -> bool:
    return hasattr(obj, "__dict__") or any("__slots__" in vars(c) for c in type(obj).__mro__)


def _attributes(obj: Any) -> dict[str, Any]:
    """An instance's data attributes: its ``__dict__`` and its slots that are set."""
    found = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found.setdefault(name, getattr(obj, name))
    return found
