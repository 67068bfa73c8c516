"""Remembered runs, the torch-free half: a call's key, its record, its lock, tending the store.

A call of a training function is keyed like a node: the function's identity (its own
code and the user helpers it calls, from ``somatize.identity``) and its arguments'
content (``somatize.values.digest``, with the codecs the caller passes). Each run has a
directory named by its key under ``<keeper dir>/remembered/``::

    remembered/<key>/run.json   what was called, its status, metrics, size (plain JSON)
    remembered/<key>/ckpt/      the run's checkpoints: a killed run resumes from them
    remembered/<key>/lock       held (flock) while the run computes: a second caller waits

The result itself lives in the keeper under the key. ``somatize.torch.remember`` adds
the codecs, the ``TrainResult`` encoding and the checkpoint accessor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import KeeperError, ValueConversionError
from .identity import _describe, parts
from .keepers import atomic_write
from .values import digest

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["CallKey", "RunStore", "call_key", "explain", "gc", "parse_age"]

FORMAT = "somatize.run/1"
FOLDER = "remembered"  # under a DiskKeeper's directory
Adapt = Callable[[Any, str], Any]  # (value, where) -> keyable data, or NotImplemented


@dataclass(frozen=True)
class CallKey:
    """The key of one call, with the parts it is made of (``explain`` compares them)."""

    key: str
    function: str
    code: str
    helpers: dict[str, str]
    versions: str
    args: dict[str, str]  # argument -> digest of its content
    summary: dict[str, str]  # argument -> a short description, for people
    excluded: tuple[str, ...]


def _unkeyable(where: str, what: str, fix: str, name: str) -> ValueConversionError:
    return ValueConversionError(
        f"{where} is {what}, which cannot enter the run's key; {fix} — or leave it out of the "
        f"key explicitly: st.remember(fn, keeper=..., exclude=({name!r},))"
    )


def keyable(value: Any, where: str, name: str, codecs: Sequence[Codec], adapt: Adapt | None) -> Any:
    """``value`` as data a digest can be taken of; an error naming ``where`` and the fix."""
    t = type(value)
    if value is None or t in (bool, int, float, str, bytes):
        return value
    if t is list or t is tuple:
        return t(keyable(v, f"{where}[{i}]", name, codecs, adapt) for i, v in enumerate(value))
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        fields = {
            f: keyable(getattr(value, f), f"{where}.{f}", name, codecs, adapt)
            for f in value._fields
        }
        return {"namedtuple": _describe(t, {}), "fields": fields}
    if isinstance(value, Mapping):  # dict, OrderedDict (a state_dict), fedavg's Aggregate
        out = {}
        for k, v in value.items():
            if type(k) is not str and type(k) is not int:
                raise _unkeyable(
                    f"{where}",
                    f"a mapping with a {type(k).__name__} key {k!r}",
                    "use str or int keys",
                    name,
                )
            out[k] = keyable(v, f"{where}[{k!r}]", name, codecs, adapt)
        return out
    for codec in codecs:
        if codec.accepts(value):
            try:
                codec.check(value)
            except ValueConversionError as e:
                raise _unkeyable(
                    where, str(e).split(";")[0], "detach it or pass plain data", name
                ) from None
            return value
    if adapt is not None:
        adapted = adapt(value, where)
        if adapted is not NotImplemented:
            return keyable(adapted, where, name, codecs, adapt)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: keyable(getattr(value, f.name), f"{where}.{f.name}", name, codecs, adapt)
            for f in dataclasses.fields(value)
        }
        return {"dataclass": _describe(t, {}), "fields": fields}
    if isinstance(value, types.FunctionType) and value.__name__ == "<lambda>":
        raise _unkeyable(
            where, "a lambda", "define it with def (its code then enters the key)", name
        )
    if isinstance(value, (types.FunctionType, type, types.BuiltinFunctionType, types.ModuleType)):
        return {"code": _describe(value, {})}
    if isinstance(value, io.IOBase):
        raise _unkeyable(where, "an open file", "pass its contents (f.read()) instead", name)
    if isinstance(value, types.GeneratorType) or hasattr(value, "__next__"):
        raise _unkeyable(
            where,
            f"a {t.__qualname__} (an iterator)",
            "pass the data itself: materialise it with list(...)",
            name,
        )
    if isinstance(value, (set, frozenset)):
        raise _unkeyable(where, "a set", "pass sorted(...) as a list", name)
    raise _unkeyable(
        where,
        f"an object of type {t.__module__}.{t.__qualname__}",
        "pass plain data (numbers, str, lists, dicts, tensors, dataclasses of those) and "
        "build the object inside the function",
        name,
    )


def summarize_value(value: Any) -> str:
    """A short description of an argument for listings: ``3``, ``tensor float32 [64, 4]``."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__} {str(dtype).removeprefix('torch.')} {list(shape)}"
    text = repr(value)
    if len(text) <= 40:
        return text
    if isinstance(value, (list, tuple, Mapping)):
        return f"{type(value).__name__} of {len(value)}"
    return text[:37] + "..."


def call_key(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    exclude: Sequence[str] = (),
    codecs: Sequence[Codec] = (),
    adapt: Adapt | None = None,
    identity: tuple[str, dict[str, str], str] | None = None,
) -> CallKey:
    """The key of ``fn(*args, **kwargs)``: its identity and its arguments' content.

    Args:
        exclude: argument names left out of the key (a pool, a logger).
        codecs: for tensor and array arguments (``somatize.torch`` passes its own).
        adapt: turns other objects into keyable data (or returns NotImplemented).
        identity: ``somatize.identity.parts(fn)`` computed elsewhere (in the process that
            shipped ``fn``); by default computed now.

    Raises:
        ValueConversionError: an argument cannot be keyed (the message names it and the fix).
    """
    import inspect

    name = f"{fn.__module__}.{fn.__qualname__}"
    sig = inspect.signature(fn)
    unknown = sorted(set(exclude) - set(sig.parameters))
    if unknown:
        raise ValueError(
            f"exclude names {', '.join(map(repr, unknown))}, which {fn.__qualname__} does not "
            f"take; its arguments: {', '.join(sig.parameters) or 'none'}"
        )
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    digests, summary = {}, {}
    for arg, value in bound.arguments.items():
        if arg in exclude:
            continue
        where = f"argument {arg!r} of {fn.__qualname__}"
        data = keyable(value, where, arg, codecs, adapt)
        digests[arg] = digest(data, codecs, where)
        summary[arg] = summarize_value(value)
    if identity is None:
        identity = parts(fn, codecs)  # type: ignore[arg-type]  # checked by the caller
    code, helpers, versions = identity
    key = digest(
        {"function": name, "code": code, "helpers": helpers, "versions": versions, "args": digests}
    )
    return CallKey(key, name, code, helpers, versions, digests, summary, tuple(sorted(exclude)))


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_size
    return total


class RunStore:
    """The directories of remembered runs under ``root`` (``<keeper dir>/remembered``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def dir(self, key: str) -> Path:
        return self.root / key

    def checkpoints(self, key: str) -> Path:
        return self.dir(key) / "ckpt"

    def record(self, key: str) -> dict[str, Any] | None:
        """The record of run ``key``, or None (never started, or unreadable)."""
        try:
            record = json.loads((self.dir(key) / "run.json").read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("format") == FORMAT else None

    def write(self, key: str, record: dict[str, Any]) -> None:
        """Write run ``key``'s record atomically.

        Raises:
            KeeperError: naming the path (a read-only or full disk).
        """
        file = self.dir(key) / "run.json"
        try:
            atomic_write(file, json.dumps({"format": FORMAT, "key": key, **record}).encode())
        except OSError as e:
            raise KeeperError(f"could not write the run record {file}: {e}") from e

    def touch(self, key: str) -> None:
        """Mark run ``key`` as used now (gc by age removes the longest unused)."""
        with contextlib.suppress(OSError):
            os.utime(self.dir(key) / "run.json")

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[bool]:
        """Hold run ``key``'s lock (waiting for another process that holds it); yields whether
        a lock could be taken (not on a read-only disk, nor where ``fcntl`` is missing)."""
        try:
            import fcntl

            self.dir(key).mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir(key) / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except (ImportError, OSError):
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
            yield True
        finally:
            os.close(fd)

    def records(self) -> list[dict[str, Any]]:
        """Every run's record, with its ``size`` (checkpoints and result) and ``used`` time; a
        directory without a record (killed before it wrote one) is listed as ``unknown``."""
        out: list[dict[str, Any]] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if d.name.startswith("."):
                continue
            record = self.record(d.name) or {"key": d.name, "status": "unknown"}
            try:
                used = (d / "run.json").stat().st_mtime
            except OSError:
                try:
                    used = d.stat().st_mtime
                except OSError:  # removed meanwhile by another process's gc
                    continue
            size = _size(d) + int(record.get("bytes", 0) if record.get("status") == "done" else 0)
            out.append({**record, "size": size, "used": used})
        return out

    def remove(self, key: str, keeper_dir: Path | None = None) -> None:
        """Forget run ``key``: its directory, and its result in a DiskKeeper at ``keeper_dir``."""
        d = self.dir(key)
        trash = self.root / f".trash-{key}-{os.getpid()}"
        with contextlib.suppress(OSError):
            os.replace(d, trash)  # the record disappears at once: no half-removed run is recalled
            shutil.rmtree(trash, ignore_errors=True)
        if keeper_dir is not None:  # DiskKeeper's documented layout: objects/ab/<key>
            with contextlib.suppress(OSError):
                os.unlink(keeper_dir / "objects" / key[:2] / key)


def parse_age(text: str) -> float:
    """Seconds in ``"90"``, ``"30m"``, ``"12h"``, ``"7d"``.

    Example:
        >>> parse_age("2h")
        7200.0
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        return float(number) * units[unit]
    except ValueError:
        raise ValueError(f"not an age: {text!r}; write e.g. 90, 30m, 12h or 7d") from None


def gc(
    keeper_dir: str | os.PathLike[str],
    *,
    older_than: float | None = None,
    max_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """Forget remembered runs unused for ``older_than`` seconds, then the least recently used
    until at most ``max_bytes`` remain. Runs computing now (their lock held) are kept.
    Returns the records of the runs removed."""
    keeper_dir = Path(keeper_dir)
    store = RunStore(keeper_dir / FOLDER)
    runs = sorted(store.records(), key=lambda r: float(r["used"]))
    now, removed = time.time(), []
    total = sum(int(r["size"]) for r in runs)
    for r in runs:
        old = older_than is not None and now - float(r["used"]) > older_than
        big = max_bytes is not None and total > max_bytes
        if not (old or big) or _busy(store, str(r["key"])):
            continue
        store.remove(str(r["key"]), keeper_dir)
        total -= int(r["size"])
        removed.append(r)
    return removed


def _busy(store: RunStore, key: str) -> bool:
    try:
        import fcntl

        fd = os.open(store.dir(key) / "lock", os.O_RDWR)
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def explain(store: RunStore, ck: CallKey, recalled: bool) -> str:
    """Why this call is (or is not) recalled: the key part that differs from the nearest run
    of the same function in ``store`` (its code, a helper, an argument, the versions)."""
    fn = ck.function.rsplit(".", 1)[-1]
    own = store.record(ck.key)
    if recalled:
        return f"recalled: {fn}({_args(ck.summary)}) finished before as run {ck.key[:12]}"
    if own is not None:
        status = own.get("status")
        why = {
            "done": "it finished, but its result is no longer in the keeper (evicted?)",
            "started": "it started and did not finish (killed?)",
        }.get(str(status), f"it raised: {own.get('error', '?')}")
        return (
            f"not recalled: run {ck.key[:12]} of {fn} has this key, but {why}; "
            "calling it again resumes from its last checkpoint"
        )
    same = [r for r in store.records() if r.get("function") == ck.function]
    if not same:
        return f"not recalled: no run of {ck.function} is remembered in {store.root}"
    # the fewest differing parts; among equals, the most recently used
    nearest, diffs = min(
        ((r, _diffs(r, ck)) for r in same), key=lambda p: (len(p[1]), -float(p[0]["used"]))
    )
    return (
        f"not recalled: the nearest run of {fn}, {str(nearest['key'])[:12]}, differs in "
        + "; ".join(diffs)
    )


def _diffs(r: Mapping[str, Any], ck: CallKey) -> list[str]:
    fn = ck.function.rsplit(".", 1)[-1]
    out = []
    if r.get("code") != ck.code:
        out.append(f"the code of {fn}")
    before, now = r.get("helpers", {}), ck.helpers
    for name in sorted(set(before) | set(now)):
        if name not in before:
            out.append(f"{fn} now reads {name!r}")
        elif name not in now:
            out.append(f"{fn} no longer reads {name!r}")
        elif before[name] != now[name]:
            kind = "helper" if now[name].startswith("code:") else "global"
            out.append(f"the {kind} {name!r} (its {'code' if kind == 'helper' else 'value'})")
    args, summary = r.get("args", {}), r.get("summary", {})
    for name in sorted(set(args) | set(ck.args)):
        if args.get(name) != ck.args.get(name):
            was, now_ = summary.get(name, "absent"), ck.summary.get(name, "absent")
            detail = f"{was} → {now_}" if was != now_ else f"{now_}, its content changed"
            out.append(f"argument {name!r} ({detail})")
    if r.get("versions") != ck.versions:
        out.append(f"the versions ({r.get('versions')} → {ck.versions})")
    return out or ["nothing it records (a run from another somatize?)"]


def _args(summary: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in summary.items())
