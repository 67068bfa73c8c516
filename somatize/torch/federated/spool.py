"""``map_clients``' transport: a batch's tasks and results pickled with their CPU tensors as
numpy buffers, and those buffers' bytes, when the workers share this host, in one file of a
per-call directory in ``/dev/shm`` rather than in the executor's pipe.

Returned as they are, the tensors of a result would go through torch's multiprocessing
reducer, which moves each storage to a shared-memory file: about a millisecond per tensor.
In the pipe, a large message is written in pieces by the executor's feeder thread, which
needs the GIL between them while this process may be unpickling the last batch's results;
the worker reading it can wait meanwhile. Through the spool the pipe carries only the rest of the pickle.

Every tensor rebuilt here starts on 64 bytes, as torch allocates them: the spool file
lays the buffers out at aligned offsets, and an in-band buffer that is not aligned is
copied (CPU GEMM sums in another order on misaligned storage: other bits than serially).

Everything here is unpickled only by the user's own processes, from bytes the user's own
code made and sent to the user's own executor (docs/federated.md); the spool files hold
raw tensor bytes, never unpickled.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import os
import pickle
import shutil
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import cloudpickle
import numpy as np
import torch

from ...platforms import alive
from ..pool import TorchPool

__all__ = ["dumps", "open_spool", "remove", "ship", "unship"]

# dtypes numpy holds exactly; others (bfloat16, float8...) take torch's own pickling
_NUMPY = {
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
}  # fmt: skip


# Where a tensor's data starts matters: CPU kernels (GEMM) split and sum in another order
# on storage that is not 64-byte aligned, so a client would compute other bits in a worker.
_ALIGN = 64  # torch's own CPU allocator aligns to 64 bytes (c10::gAlignment)


def _rebuild(buf: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over ``buf``, a writable buffer the unpickling made (its own: no copy), or
    a copy in torch's own storage where ``buf`` is not 64-byte aligned (an in-band
    buffer: the unpickler's ``bytearray``; ``unship`` lays the spool's out aligned).
    (numpy's ``frombuffer`` and ``from_numpy`` cost less than ``torch.frombuffer``.)"""
    t = torch.from_numpy(np.frombuffer(buf, dtype=dtype).reshape(shape))
    return t.clone() if t.data_ptr() % _ALIGN else t


def _buffered(t: torch.Tensor, array: np.ndarray[Any, Any]) -> Any:
    """A CPU tensor as its bytes (out-of-band where the pickler takes buffers)."""
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return _rebuild, (pickle.PickleBuffer(array), array.dtype, array.shape)  # type: ignore[arg-type]


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle (lambdas, ``__main__`` classes) with CPU tensors as numpy buffers."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.dtype in _NUMPY
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
            and not obj.requires_grad
        ):
            return _buffered(obj, obj.resolve_conj().resolve_neg().numpy())
        return super().reducer_override(obj)


def dumps(value: Any) -> bytes:
    """``value`` pickled by cloudpickle, CPU tensors as numpy buffers, in-band."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()


def _reduce_tensor(t: torch.Tensor) -> Any:
    try:  # numpy() refuses what numpy cannot hold as it is: grad, CUDA, sparse, conj, bfloat16
        array = t.numpy()
    except (RuntimeError, TypeError):
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return _buffered(t, array)


# Plain pickle (by reference) with CPU tensors as numpy buffers. A dispatch table, not
# ``reducer_override``: no Python call for each of the many small objects a batch holds.
_TABLE: dict[type, Any] = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}


def _pickled(values: Any, buffers: list[pickle.PickleBuffer] | None, to_worker: bool) -> bytes:
    """Plain pickle by reference; cloudpickle for what it cannot name (a lambda, a local
    class) and, on the way to a worker, for anything of ``__main__`` (a worker started by
    forkserver or spawn, or forked before it was defined, may not have it)."""
    kwargs: dict[str, Any] = {} if buffers is None else {"buffer_callback": buffers.append}
    f = io.BytesIO()
    try:
        pickler = pickle.Pickler(f, protocol=5, **kwargs)
        pickler.dispatch_table = _TABLE
        pickler.dump(values)
        head = f.getvalue()
        if not (to_worker and b"__main__" in head):
            return head
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    if buffers is not None:
        buffers.clear()
    f = io.BytesIO()
    _Pickler(f, protocol=5, **kwargs).dump(values)
    return f.getvalue()


def ship(values: list[Any], spool: str | None, *, to_worker: bool = False) -> Any:
    """A batch's tasks or results: ``(path, pickle, sizes)`` with the tensors' bytes in a
    file of ``spool``, or in-band bytes (no spool, no tensors, or a full ``/dev/shm``)."""
    if spool is not None:
        buffers: list[pickle.PickleBuffer] = []
        head = _pickled(values, buffers, to_worker)
        if not buffers:
            return head
        views = [b.raw() for b in buffers]
        try:
            fd, path = tempfile.mkstemp(dir=spool)
            try:
                _write_all(fd, _padded(views))
            except BaseException:
                os.unlink(path)
                raise
            finally:
                os.close(fd)
        except OSError:  # /dev/shm full, or the call is over and its spool removed
            pass
        else:
            return path, head, [v.nbytes for v in views]
    return _pickled(values, None, to_worker)


def _offsets(sizes: list[int]) -> tuple[list[int], int]:
    """Where each buffer starts in a spool file, every one at a multiple of ``_ALIGN``,
    and the file's length (no padding after the last)."""
    offsets, end = [], 0
    for n in sizes:
        start = -(-end // _ALIGN) * _ALIGN
        offsets.append(start)
        end = start + n
    return offsets, end


_ZEROS = memoryview(bytes(_ALIGN))


def _padded(views: list[memoryview]) -> list[memoryview]:
    """``views`` with the zero bytes between them that ``_offsets`` lays out."""
    offsets, _ = _offsets([v.nbytes for v in views])
    out, end = [], 0
    for v, start in zip(views, offsets):
        if start > end:
            out.append(_ZEROS[: start - end])
        out.append(v)
        end = start + v.nbytes
    return out


def _write_all(fd: int, views: list[memoryview]) -> None:
    """Write every view, in order, a thousand per system call."""
    pending, i = [v.cast("B") for v in views if v.nbytes], 0
    while i < len(pending):
        done = os.writev(fd, pending[i : i + 1024])
        while i < len(pending) and done >= pending[i].nbytes:
            done -= pending[i].nbytes
            i += 1
        if done:  # a short write: the rest of this view next time
            pending[i] = pending[i][done:]


def unship(shipped: Any, spool: str | None, *, keep: bool = False) -> list[Any]:
    """What ``ship`` made, through the user's own executor, in the user's own processes.

    Only the pickle is unpickled, as the executor's own messages are. The spool file (in
    a directory ``mkdtemp`` made for this call, readable by this user only) holds raw
    tensor bytes: they become out-of-band buffers, data that is never unpickled; the file
    is removed once read, unless ``keep`` (a batch's tasks: a pool that re-runs the batch
    of a lost worker sends the same payload again; the caller removes it, ``discard``)."""
    if isinstance(shipped, bytes):  # in-band, as ship pickled it
        # ship's bytes, from the user's own process or worker via the user's own executor
        return pickle.loads(shipped)  # type: ignore[no-any-return]
    path, head, sizes = shipped
    if spool is None or os.path.dirname(path) != spool:
        raise ValueError(f"a batch names {path!r}, outside this call's spool {spool!r}")
    offsets, length = _offsets(sizes)
    raw = np.empty(length + _ALIGN, dtype=np.uint8)  # read into its 64-byte-aligned part
    skip = -raw.ctypes.data % _ALIGN
    view = memoryview(raw[skip : skip + length])  # type: ignore[arg-type]
    with open(path, "rb") as fh:
        got = fh.readinto(view)
    if not keep:
        os.unlink(path)
    if got != length:
        raise ValueError(f"a batch's spool file {path!r} holds {got} bytes of {length}")
    buffers = [view[start : start + n] for start, n in zip(offsets, sizes)]
    # the pickle ship made; the file's bytes only fill its tensors' buffers
    return pickle.loads(head, buffers=buffers)  # type: ignore[no-any-return]


def discard(shipped: Any) -> None:
    """Remove the spool file of what ``ship`` made, if it made one and it is still there."""
    if not isinstance(shipped, bytes):
        with contextlib.suppress(OSError):
            os.unlink(shipped[0])


def remove(spool: str) -> None:
    """Remove a call's spool, and what a batch still running after an error writes there:
    renamed first, so that no file can be made under its name while it is removed."""
    closed = f"{spool}.closed"
    try:
        os.rename(spool, closed)
    except OSError:
        closed = spool
    shutil.rmtree(closed, ignore_errors=True)


_SHM, _PREFIX = "/dev/shm", "somatize-results-"


def open_spool(pool: Executor) -> str | None:
    """A fresh directory in shared memory for one call's tasks and results, when the pool's workers
    run on this host and the host has ``/dev/shm``; named by this process, so that the
    spools of a process killed mid-round are found and removed by the next call."""
    if not isinstance(pool, (ProcessPoolExecutor, TorchPool)) or not os.path.isdir(_SHM):
        return None
    _sweep()
    try:
        return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_SHM)
    except OSError:
        return None


_STALE = 600.0  # seconds a spool must have been left alone before another process sweeps it


def _sweep() -> None:
    """Remove the spools left in ``/dev/shm`` by processes that no longer exist.

    Only those untouched for ``_STALE`` seconds: a ``/dev/shm`` shared by containers with
    their own process ids (a pod's memory volume) may hold a live spool whose pid means
    nothing here, and a live call writes into its spool, and reads it, within seconds."""
    try:
        names = [n for n in os.listdir(_SHM) if n.startswith(_PREFIX)]
    except OSError:
        return
    now = time.time()
    for name in names:
        pid = name[len(_PREFIX) :].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        path = os.path.join(_SHM, name)
        try:
            if now - os.stat(path).st_mtime < _STALE or alive(int(pid)):
                continue  # (alive: another user's too)
        except OSError:  # already removed
            continue
        shutil.rmtree(path, ignore_errors=True)  # its process is gone: it is nobody's
