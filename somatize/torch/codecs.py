"""Codecs for tensors and numpy arrays, and fingerprints of module state.

With these codecs a *detached* tensor (or an ndarray) is data: it is validated,
keyed by blake3 over its dtype, shape and raw bytes (fed to blake3 without a
copy), and stored in keepers as a small header plus the raw bytes — never
pickled. A tensor that requires grad is refused ("wrap it in Opaque to keep the
autograd graph, or detach it"); it is never detached silently.

The same codec fingerprints what nodes hold — modules, parameters, buffers — so
a node's weights enter its key. Each tensor's digest is remembered with its
version counter: re-keying an unchanged module costs a lookup per tensor, and
any in-place change (an optimizer step, ``load_state``) is seen. Two writes move
no version counter, so the memo cannot see them: batch norm's running statistics
(hence the buffers of a module in training mode are hashed every time), and
writes through ``.data`` (change weights under ``torch.no_grad()`` instead).
"""

from __future__ import annotations

import ctypes
import functools
import struct
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from blake3 import blake3
from torch import nn

from ..errors import ValueConversionError
from ..values import decode as decode_data
from ..values import encode as encode_data
from .fingerprints import module_fingerprint

__all__ = ["NdarrayCodec", "TensorCodec", "default_codecs"]

_LEN = struct.Struct(">Q")
_HEADERS: dict[tuple[torch.dtype, tuple[int, ...]], bytes] = {}  # (dtype, shape) -> header
# (dtype, shape) -> what a lone tensor's key hashes before its payload
_KEY_STARTS: dict[tuple[torch.dtype, tuple[int, ...]], bytes] = {}
# (dtype, shape) -> that start and the ctypes array type of the payload, for tensors of at
# most 64 KiB of a dtype without a conj bit (not complex) whose key was made through numpy()
# once: what ``TensorCodec.key`` needs to read a tensor's bytes by its data pointer
_SMALL: dict[tuple[torch.dtype, tuple[int, ...]], tuple[bytes, Any]] = {}
_STRIDED = torch.strided


def _header(t: torch.Tensor) -> bytes:
    """The header of a tensor's payload (its dtype and shape), made once per pair."""
    shape = t.shape  # (a torch.Size hashes and compares as the tuple it is)
    header = _HEADERS.get((t.dtype, shape))
    if header is None:
        encoded = encode_data((str(t.dtype).removeprefix("torch."), tuple(shape)))
        header = _LEN.pack(len(encoded)) + encoded
        if len(_HEADERS) < 4096:
            _HEADERS[t.dtype, tuple(shape)] = header
    return header


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor as a flat byte view, without a copy when it is contiguous on CPU."""
    try:  # the common case, without making views: numpy's buffer is the tensor's own memory
        return memoryview(t.numpy()).cast("B")  # type: ignore[arg-type]
    except (TypeError, RuntimeError):
        pass  # not on CPU, requires grad, conj/neg bit, no numpy dtype, not C-contiguous, empty
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous().reshape(-1)  # lazy conj/neg views: real bytes
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]


# The tensor types that are data: a subclass's type, and what it carries beside its
# values, would enter no key and not survive a store
_PLAIN = frozenset({torch.Tensor, nn.Parameter, *([nn.Buffer] if hasattr(nn, "Buffer") else [])})


def subclass_error(value: torch.Tensor) -> ValueConversionError:
    """The error for a tensor subclass met as data (a key, a stored row)."""
    name = type(value).__qualname__
    return ValueConversionError(
        f"a {name}, a torch.Tensor subclass: its type (and whatever it carries beside its "
        f"values) would enter no key, and a stored copy comes back a plain tensor, so a "
        f"cached node would serve one {name}'s output for another, or for a plain tensor of "
        "the same values — pass x.as_subclass(torch.Tensor) as data (and what the subclass "
        "carries as data of its own), or wrap it in Opaque(...) and cache no node it reaches"
    )


class TensorCodec:
    """Detached tensors as data; modules, parameters and buffers fingerprinted as state.

    Attributes:
        hashed: how many tensor digests were computed (not served from the version memo).
    """

    tag = "torch.tensor"

    def __init__(self) -> None:
        # id(tensor) -> (weak ref, (version, data_ptr, dtype, shape, stride), digest). Keyed by
        # id, checked by identity: tensors compare elementwise, so they cannot be dict keys.
        self._memo: dict[int, tuple[weakref.ref[torch.Tensor], tuple[Any, ...], str]] = {}
        self.hashed = 0
        self._limit = 4096
        # id(module) -> (weak ref, what its fingerprint was made of, the fingerprint)
        self._modules: dict[int, tuple[weakref.ref[nn.Module], list[Any], str]] = {}

    def __getstate__(self) -> dict[str, Any]:  # the memos hold weak references: not data
        return {**self.__dict__, "_memo": {}, "_modules": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_modules": {}, **state})

    def forget(self) -> None:
        """Drop the digest memos, so every tensor is hashed afresh when next asked for.

        The memos trust a tensor's version counter, which some writes do not move:
        ``p.data.mul_(2)``, a write through ``p.detach().numpy()``, fused optimizers
        (``Adam(fused=True)``). ``st.module(g)`` (so every ``fit``) calls this."""
        self._memo.clear()
        self._modules.clear()

    def context(self) -> tuple[tuple[str, str], ...] | None:
        """What a node's output depends on besides its state and inputs: the autocast
        dtype of each device type where autocast is on (None where it is off everywhere,
        so keys made without autocast do not change)."""
        if _any_autocast is not None and not _any_autocast():  # (the common case: 0.1 µs)
            return None
        on = tuple(
            (device, str(torch.get_autocast_dtype(device)))
            for device in _AUTOCAST_DEVICES
            if torch.is_autocast_enabled(device)
        )
        return on or None

    @property
    def rows(self) -> Any:
        """Rows along dim 0, for per-example memory (``somatize.torch.rows.TensorRows``)."""
        return _rows()

    def accepts(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def check(self, value: torch.Tensor) -> None:
        if (
            value.is_cpu
            and not value.requires_grad
            and value.layout is torch.strided
            and not value.is_quantized
        ):
            return  # the common case, in four attribute reads
        if value.requires_grad:
            what = f"a tensor of shape {tuple(value.shape)} that requires grad"
            e = ValueConversionError(
                f"{what}; wrap it in Opaque(...) "
                "to keep the autograd graph (a node's output that should train its node), or "
                "detach it (.detach()) to pass it as data — a detached output trains nothing "
                "before it, so freeze that node (g.freeze(...)) if that is what you mean"
            )
            e.as_input = (
                f"{what} as data; to keep its autograd graph (input gradients), pass the "
                "whole input by identity — model(Opaque(batch)) for module(g), "
                "g.forward(Opaque(batch)) — or detach it (.detach())"
            )
            raise e
        if value.layout != torch.strided or value.is_quantized or value.device.type == "meta":
            raise ValueConversionError(
                f"a {value.layout} tensor on {value.device}; only dense tensors with storage are "
                "data — convert it (.to_dense()) or wrap it in Opaque(...)"
            )

    def chunks(self, value: torch.Tensor) -> Iterable[bytes | memoryview]:
        self.check(value)
        if type(value) not in _PLAIN:  # (keyed or stored: checked data may be one, uncached)
            raise subclass_error(value)
        return (_header(value), _tensor_bytes(value))

    def key(self, value: torch.Tensor) -> str | None:
        """``digest(value, codecs)`` of a lone tensor, by a shorter road: blake3 of the same
        bytes (tag, size, header, payload), with everything but the payload made once per
        dtype and shape. None where the general path must word or convert something (a
        tensor that is not a plain C-contiguous CPU tensor).

        A small tensor of a (dtype, shape) keyed before through ``numpy()`` (``_key``) is
        read through its data pointer: six checks stand in for ``numpy()``'s, and no array
        is made (0.7 µs)."""
        if type(value) is torch.Tensor:
            try:
                known = _SMALL.get((value.dtype, value.shape))
                if (
                    known is not None
                    and value.is_cpu
                    and not value.requires_grad
                    and value.layout is _STRIDED
                    and value.is_contiguous()
                    and not value.is_neg()  # (no conj bit to test: complex dtypes are not kept)
                ):
                    ptr = value.data_ptr()
                    if ptr:  # (0: a tensor with no memory, such as a ZeroTensor)
                        start, raw = known  # the key's first bytes, a ctypes array type
                        # (the join copies the bytes under the GIL, while value is held)
                        return blake3(b"".join((start, raw.from_address(ptr)))).digest().hex()
            except RuntimeError:  # (a tensor without storage: a functorch or nested tensor)
                return None
        return self._key(value)

    def _key(self, value: torch.Tensor) -> str | None:
        """``key`` through ``numpy()``, which checks what the tensor is; keeps what the fast
        road needs for a small tensor of a real dtype."""
        if type(value) not in _PLAIN or not value.is_contiguous():  # (check words a subclass)
            return None
        try:  # (the array itself: join reads its buffer, and a memoryview costs a call)
            array = value.numpy()
        except (TypeError, RuntimeError):
            return None
        nbytes = array.nbytes
        start = _KEY_STARTS.get((value.dtype, value.shape))
        if start is None:  # what values.digest writes before a codec leaf's chunks
            header, tag = _header(value), self.tag.encode()
            size = _LEN.pack(len(header) + nbytes)
            start = b"c" + _LEN.pack(len(tag)) + tag + size + header
            if len(_KEY_STARTS) < 4096:
                _KEY_STARTS[value.dtype, tuple(value.shape)] = start
        if nbytes <= 65536:  # one update: copying a small payload costs less than a call
            if (
                type(value) is torch.Tensor
                and nbytes
                and not value.dtype.is_complex
                and len(_SMALL) < 4096
                and (value.dtype, value.shape) not in _SMALL
            ):
                _SMALL[value.dtype, tuple(value.shape)] = (start, ctypes.c_char * nbytes)
            return blake3(b"".join((start, array))).digest().hex()  # type: ignore[arg-type]
        h = blake3(start)
        h.update(memoryview(array).cast("B"))  # type: ignore[arg-type]  # (byte views only)
        return h.hexdigest()

    def decode(self, payload: bytes) -> torch.Tensor:
        (n,) = _LEN.unpack_from(payload)
        dtype_name, shape = decode_data(payload[8 : 8 + n])
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a tensor payload names {dtype_name!r}, which is not a torch dtype")
        raw = payload[8 + n :]
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)

    def digest(self, t: torch.Tensor, *, fresh: bool = False) -> str:
        """The content digest of a tensor (dtype, shape, bytes), memoised by version counter.

        Args:
            t: the tensor.
            fresh: hash the bytes even if the memo says they have not changed.
        """
        seen: tuple[Any, ...]
        try:
            seen = (t._version, t.data_ptr(), t.dtype, t.shape, t.stride())
        except RuntimeError:  # made under torch.inference_mode(): no version counter to trust
            seen, fresh = (), True
        memo = self._memo.get(id(t))
        if not fresh and memo is not None and memo[0]() is t and memo[1] == seen:
            return memo[2]
        h = blake3()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(_tensor_bytes(t))
        result = h.hexdigest()
        self.hashed += 1
        if not seen:
            return result
        if len(self._memo) > self._limit:  # forget tensors that no longer exist
            self._memo = {k: v for k, v in self._memo.items() if v[0]() is not None}
            self._limit = max(4096, 2 * len(self._memo))
        self._memo[id(t)] = (weakref.ref(t), seen, result)
        return result

    def fingerprint(self, obj: Any) -> str | None:
        """The digest of a tensor, of a module's structure, modes and state
        (``somatize.torch.fingerprints``), of a generator's state (a node drawing from its
        own: each call a new key, as each draws anew), or the name of a dtype, device,
        layout or memory format.

        A module's fingerprint is made of each submodule's name, class (and, for the
        user's own classes, the fingerprint of their code), mode, plain attributes
        (``negative_slope``, ``eps``) and forward hooks, with the digest of each parameter
        and buffer (memoised by version counter) and torch's global forward hooks. When all of
        those equal what the last fingerprint of the same module was made of, that
        fingerprint is returned without hashing them again: a frozen backbone asked for
        its state every batch costs a walk of its modules, not a hash.
        """
        if isinstance(obj, torch.Tensor):
            return self.digest(obj)
        if isinstance(obj, torch.Generator):  # a node's own randomness: where it stands
            return f"generator:{blake3(obj.get_state().numpy()).hexdigest()}"
        if not isinstance(obj, nn.Module):
            return f"{type(obj).__name__}:{obj}" if isinstance(obj, _NAMED) else None
        return module_fingerprint(self, obj)

    def _remember_module(self, obj: nn.Module, parts: list[Any], result: str) -> None:
        """Keep what ``obj``'s fingerprint ``result`` was made of (see ``fingerprints``)."""
        if len(self._modules) > 1024:  # forget modules that no longer exist
            self._modules = {k: v for k, v in self._modules.items() if v[0]() is not None}
        self._modules[id(obj)] = (weakref.ref(obj), parts, result)


_NAMED = (torch.dtype, torch.device, torch.layout, torch.memory_format)  # enter a state by name


_AUTOCAST_DEVICES = ("cpu", "cuda")
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)  # (private: may go away)


@functools.cache
def _rows() -> Any:
    from .rows import TensorRows

    return TensorRows()


class NdarrayCodec:
    """numpy arrays (and numpy scalars) as data: keyed by dtype, shape and raw bytes."""

    tag = "numpy.ndarray"

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
        if not self.accepts(obj):
            return None
        h = blake3()
        for chunk in self.chunks(obj):
            h.update(chunk)
        return h.hexdigest()


def default_codecs() -> tuple[TensorCodec, NdarrayCodec]:
    """The codecs ``module(g)`` and the Trainer give a graph: tensors and ndarrays."""
    return (TensorCodec(), NdarrayCodec())
