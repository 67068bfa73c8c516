"""numpy arrays and scalars as data: keyed by dtype, shape and raw bytes (``NdarrayCodec``)."""

from __future__ import annotations

import struct
import sys
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

from blake3 import blake3

from ..errors import ValueConversionError
from ..stack import outside
from ..values import decode as decode_data
from ..values import encode as encode_data

__all__ = ["NdarrayCodec"]

_LEN = struct.Struct(">Q")


class NdarrayCodec:
    """numpy arrays (and numpy scalars) as data: keyed by dtype, shape and raw bytes."""

    tag = "numpy.ndarray"

    def __init__(self) -> None:
        # id -> (weak reference, layout, digest) of read-only arrays: hashed once
        self._memo: dict[int, tuple[Any, tuple[Any, ...], str]] = {}
        self._warned: set[int] = set()
        self.hashed = 0  # arrays hashed (a count tests read)

    def accepts(self, value: Any) -> bool:
        np = sys.modules.get("numpy")
        return np is not None and isinstance(value, (np.ndarray, np.generic))

    def check(self, value: Any) -> None:
        if value.dtype.hasobject:
            raise ValueConversionError(
                "a numpy array of Python objects; convert it to a numeric dtype or to a list"
            )

    def chunks(self, value: Any) -> Iterable[bytes | memoryview]:
        import numpy as np

        self.check(value)
        scalar = isinstance(value, np.generic)
        arr = np.asarray(value)
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
            arr = arr.copy(order="C")
        header = encode_data((arr.dtype.str, tuple(arr.shape), scalar))
        flat = arr.reshape(-1).view(np.uint8)
        raw = memoryview(flat) if arr.size else memoryview(b"")  # type: ignore[arg-type]
        return (_LEN.pack(len(header)) + header, raw)

    def decode(self, payload: bytes) -> Any:
        import numpy as np

        (n,) = _LEN.unpack_from(payload)
        dtype, shape, scalar = decode_data(payload[8 : 8 + n])
        arr = np.frombuffer(payload[8 + n :], dtype=np.dtype(dtype)).reshape(shape).copy()
        return arr[()] if scalar else arr

    def fingerprint(self, obj: Any) -> str | None:
        """The digest of an array's dtype, shape and bytes. numpy keeps no record of writes,
        so a writeable array is hashed at every call (a global a node reads: at every key);
        a read-only one (``arr.setflags(write=False)``, down to the memory it views) is
        hashed once. A writeable array of ``_LARGE`` bytes or more warns, once."""
        if not self.accepts(obj):
            return None
        frozen = _read_only(obj)
        if frozen:
            seen = (obj.__array_interface__["data"][0], obj.dtype, obj.shape, obj.strides)
            memo = self._memo.get(id(obj))
            if memo is not None and memo[0]() is obj and memo[1] == seen:
                return memo[2]
        elif obj.nbytes >= _LARGE and id(obj) not in self._warned:
            self._warned.add(id(obj))
            warnings.warn(
                f"a writeable numpy array ({obj.dtype}, shape {obj.shape}, "
                f"{obj.nbytes / 2**20:.0f} MiB, or a view of writeable memory) is part of a "
                "node's key: numpy keeps no record of writes, so it is hashed anew at every "
                "key. Mark it read-only (arr.setflags(write=False), or "
                "np.load(..., mmap_mode='r'): hashed once) or hold it as a torch tensor "
                "(torch.tensor(arr): a copy, its writes tracked by its version counter)",
                RuntimeWarning,
                stacklevel=outside(),
            )
        h = blake3()
        for chunk in self.chunks(obj):
            h.update(chunk)
        result = h.hexdigest()
        self.hashed += 1
        if frozen:
            if len(self._memo) > 1024:  # forget arrays that no longer exist
                self._memo = {k: v for k, v in self._memo.items() if v[0]() is not None}
            self._memo[id(obj)] = (weakref.ref(obj), seen, result)
        return result


_LARGE = 8 << 20  # bytes: a writeable array this large hashed at every key warns


def _read_only(arr: Any) -> bool:
    """Whether no write through numpy can reach ``arr``'s memory: it and every array it
    views are read-only, down to memory an array owns, ``bytes``, or a file mapped
    read-only (``np.load(path, mmap_mode="r")``; not another object's buffer, which can be
    written elsewhere)."""
    import numpy as np

    if not isinstance(arr, np.ndarray):
        return False  # (a numpy scalar: small, hashed as it is)
    while not arr.flags.writeable:
        if isinstance(arr, np.memmap) and arr.mode == "r":
            return True  # (its file opened read-only: rewriting it is outside any key)
        base = arr.base
        if base is None or type(base) is bytes:
            return True
        if not isinstance(base, np.ndarray):
            return False
        arr = base
    return False
