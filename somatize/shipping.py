"""Shipping code: a slice's node implementations as explicit cloudpickle bytes.

Classes and functions from the user's own modules (not the standard library,
site-packages or somatize) are pickled *by value*, so a worker needs only somatize
and the libraries the nodes use — not the user's code. A worker unpickles a given
set of bytes once and keeps it by digest. Nothing but these code bytes, sent by the
user's own caller to their own executor, is ever unpickled: values cross as codec
bytes. **Unpickling runs code: ship only to executors you control.**
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from blake3 import blake3

from .errors import TransportError

if TYPE_CHECKING:
    from types import ModuleType

    from .codecs import Codec

__all__ = ["Bundle", "load_code", "pack_code"]


class Bundle(NamedTuple):
    """The code of a slice once loaded on a worker: node implementations, codecs, and the
    forward each node runs by where the caller's runtime wraps it (a frozen node's: in eval
    mode, without grad, ``ctx.training`` False — as it runs on the caller's host)."""

    impls: dict[str, Any]
    codecs: tuple[Codec, ...]
    forwards: dict[str, Any]


_pack_lock = threading.Lock()
_user: dict[str, bool] = {}


def _user_modules() -> list[ModuleType]:
    """Imported modules of the user's own code (not stdlib, site-packages or somatize)."""
    from .identity import _is_user_module

    found = []
    for name, module in list(sys.modules.items()):
        if name == "__main__" or module is None:
            continue  # __main__ is always pickled by value
        mine = _user.get(name)
        if mine is None:
            mine = _user[name] = _is_user_module(module)
        if mine:
            found.append(module)
    return found


def pack_code(
    impls: Mapping[str, Any],
    codecs: Sequence[Codec],
    name: str,
    forwards: Mapping[str, Any] | None = None,
) -> bytes:
    """Cloudpickle bytes of a slice's nodes and codecs, the user's own classes by value;
    ``forwards``: the wrapped forward to run for a node in place of its own.

    Raises:
        TransportError: a node cannot be pickled; the message names it.

    Example:
        >>> load_code(blake3(b := pack_code({}, (), "s")).hexdigest(), b, "s")
        Bundle(impls={}, codecs=(), forwards={})
    """
    import cloudpickle  # type: ignore[import-untyped]

    with _pack_lock:
        registered = cloudpickle.list_registry_pickle_by_value()
        added = [m for m in _user_modules() if m.__name__ not in registered]
        for m in added:
            cloudpickle.register_pickle_by_value(m)
        try:
            shipped = (dict(impls), tuple(codecs), dict(forwards or {}), keyed_versions())
            data: bytes = cloudpickle.dumps(shipped, pickle.HIGHEST_PROTOCOL)
            if _packer[0] != os.getpid():  # (a forked worker inherits the set: not its own)
                _packed_here.clear()
                _packer[0] = os.getpid()
            _packed_here.update(_tracked_classes())
            return data
        except Exception as e:
            culprit = "its codecs"
            for node, impl in impls.items():
                try:
                    cloudpickle.dumps(impl)
                except Exception:
                    culprit = f"node {node!r} ({type(impl).__qualname__})"
                    break
            raise TransportError(
                f"{name}: {culprit} cannot be pickled to send it to its host "
                f"({type(e).__name__}: {e}); a node that runs on another host must pickle — "
                "hold no open files, locks or connections (make them in forward), or place it "
                "on 'local'"
            ) from e
        finally:
            for m in added:
                cloudpickle.unregister_pickle_by_value(m)


# Classes this process shipped by value. cloudpickle, unpickling such a class in the process
# that pickled it (InProcess, a thread pool, Dask's processes=False), finds the class itself
# and sets its attributes anew from the bytes: its methods replaced by copies whose globals
# are a snapshot — the caller's own class would no longer see a global rebound. A worker
# process, which packs nothing (a forked one inherits the set, not the pid), takes the new
# code as it should.
_packed_here: weakref.WeakSet[type] = weakref.WeakSet()
_packer = [0]  # the pid that filled _packed_here
_ABSENT = object()


def _tracked_classes() -> list[type]:
    """The classes cloudpickle has pickled by value in this process (its class tracker)."""
    from cloudpickle import cloudpickle as cp  # type: ignore[import-untyped]

    tracker = getattr(cp, "_DYNAMIC_CLASS_TRACKER_BY_CLASS", None)
    return list(tracker.keys()) if tracker is not None else []


def _restore(kept: list[tuple[type, dict[str, Any]]]) -> None:
    """Put back the attributes of classes this process shipped, as they were before an
    unpickling here set them anew."""
    for cls, before in kept:
        now = vars(cls)
        for attr, value in before.items():
            if now.get(attr, _ABSENT) is not value:
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(cls, attr, value)


_bundles: OrderedDict[str, Bundle] = OrderedDict()
_bundles_lock = threading.Lock()
_bundles_pid = [os.getpid()]  # the process they were loaded in
_MAX_BUNDLES = 32


def load_code(digest: str, code: bytes | None, name: str) -> Bundle | None:
    """The code of a slice on this worker: cached by digest, else unpickled from ``code``.

    Returns None when the digest is unknown here and ``code`` was not sent. Only code
    bytes shipped by the user's own caller are ever unpickled.

    Raises:
        TransportError: the bytes are damaged or name a module this worker lacks.
    """
    with _bundles_lock:
        if _bundles_pid[0] != os.getpid():  # forked: the parent's bundles hold its live classes
            _bundles.clear()
            _bundles_pid[0] = os.getpid()
        bundle = _bundles.get(digest)
        if bundle is not None:
            _bundles.move_to_end(digest)
            return bundle
    if code is None:
        return None
    if blake3(code).hexdigest() != digest:
        raise TransportError(f"{name}: the code arrived damaged (its digest does not match)")
    here = _packer[0] == os.getpid()
    kept = [(cls, dict(vars(cls))) for cls in list(_packed_here)] if here else []
    try:
        impls, codecs, forwards, versions = pickle.loads(code)  # code the user sent here
    except Exception as e:
        if isinstance(e, ImportError | AttributeError):  # a module or a name missing here
            fix = (
                "classes from installed packages travel by reference — install that package "
                "(the version the caller runs) on the workers"
            )
        else:  # (the bytes arrived whole: an object's own __setstate__ or __reduce__ refused)
            fix = (
                "an object a node holds refused to be rebuilt in the worker (its __setstate__ "
                "or __reduce__ raised) — make it in forward, on the worker, or place the node "
                "on 'local'"
            )
        raise TransportError(
            f"{name}: the worker could not load the nodes ({type(e).__name__}: {e}); {fix}"
        ) from e
    finally:
        _restore(kept)
    _check_versions(versions, name)
    bundle = Bundle(impls, tuple(codecs), forwards)
    with _bundles_lock:
        _bundles[digest] = bundle
        while len(_bundles) > _MAX_BUNDLES:
            _bundles.popitem(last=False)
    return bundle


def keyed_versions() -> dict[str, str]:
    """The versions a key names (somatize, and torch where this process runs it), installed
    here: a worker must run the same, or it computes other code under the caller's keys."""
    found: dict[str, str] = {}
    for dist in ("somatize", "torch"):
        if dist == "somatize" or dist in sys.modules:
            found[dist] = _installed(dist)
    return found


def _installed(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _check_versions(sent: Mapping[str, str], name: str) -> None:
    """A ``TransportError`` where this worker runs another version than the caller of a
    package the caller's keys name (one not installed here, run from a source tree, has no
    version to tell)."""
    wrong = [
        (d, v, here)
        for d, v in sent.items()
        if (here := _installed(d)) != v and "not installed" not in (v, here)
    ]
    if wrong:
        said = ", ".join(f"{d} {v} there, {here} here" for d, v, here in wrong)
        raise TransportError(
            f"{name}: the caller and this worker run other versions ({said}); its keys name "
            "the caller's, so this worker would store what other code computed under them — "
            f"install the caller's version on the workers: pip install "
            f"{' '.join(f'{d}=={v}' for d, v, _ in wrong)}"
        )
