"""Codecs for tensors and numpy arrays, and fingerprints of module state.

With these codecs a *detached* tensor (or an ndarray) is data: it is validated,
keyed by its dtype, shape and raw bytes (a lone tensor: keyed blake3 of its bytes under
a key made of its dtype and shape, ``tensor_keys.py``; bytes fed to blake3 without a
copy), and stored in keepers as a small header plus the raw bytes — never
pickled. A tensor that requires grad is refused ("wrap it in Opaque to keep the
autograd graph, or detach it"); it is never detached silently.

The same codec fingerprints what nodes hold — modules, parameters, buffers — so
a node's weights enter its key. Each tensor's digest is remembered with its
version counter: re-keying an unchanged module costs a lookup per tensor, and
any in-place change (an optimizer step, ``load_state``) is seen. The memo holds the
tensors, never a weak reference to one, which ``torch.utils.swap_tensors`` refuses
(``tensor_memo.py``). Two writes move no version counter, so the memo cannot see them:
batch norm's running statistics (hence the buffers of a module in training mode are
hashed every time), and writes through ``.data`` (change weights under
``torch.no_grad()`` instead).
"""

from __future__ import annotations

import functools
import struct
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from blake3 import blake3
from torch import nn

from ..node_state import Codes
from ..values import decode as decode_data
from ..values import encode as encode_data
from .fingerprints import module_fingerprint
from .module_code import script_function
from .ndarray_codec import NdarrayCodec
from .rows import empty
from .tensor_keys import _PLAIN, check_tensor, subclass_error, tensor_bytes, tensor_key
from .tensor_memo import TensorMemo

__all__ = ["NdarrayCodec", "TensorCodec", "default_codecs"]

_LEN = struct.Struct(">Q")
_TENSOR = torch.Tensor
_HEADERS: dict[tuple[torch.dtype, tuple[int, ...]], bytes] = {}  # (dtype, shape) -> header


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


class TensorCodec:
    """Detached tensors as data; modules, parameters and buffers fingerprinted as state.

    Attributes:
        hashed: how many tensor digests were computed (not served from the version memo).
    """

    tag = "torch.tensor"

    def __init__(self) -> None:
        # id(tensor) -> (the tensor, (version, data_ptr, dtype, shape, stride), digest). Keyed
        # by id, checked by identity: tensors compare elementwise, so they cannot be dict keys.
        self._memo = TensorMemo()
        self.hashed = 0
        # id(module) -> (weak ref, what its fingerprint was made of, the fingerprint)
        self._modules: dict[int, tuple[weakref.ref[nn.Module], list[Any], str]] = {}
        self._others: tuple[Any, ...] | None = None  # the graph's other codecs (``join``)
        self._held: Codes | None = None  # how what modules hold is read (``_held_codes``)

    def __getstate__(self) -> dict[str, Any]:  # the memos: what this process saw, not data
        return {**self.__dict__, "_memo": TensorMemo(), "_modules": {}, "_held": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_modules": {}, "_others": None, "_held": None, **state})
        if not isinstance(self._memo, TensorMemo):  # (pickled before the memo was its own)
            self._memo = TensorMemo()
        self.__dict__.pop("_limit", None)

    def join(self, codecs: Sequence[Any]) -> None:
        """Read what modules hold (an attribute that is neither a number nor a tensor: a
        numpy array or float) with ``codecs`` — the graph's, this one among them — as a
        node's own attributes are read. ``module(g)`` and the Trainer join a graph's tensor
        codecs to its codecs; a codec never joined reads them with an ``NdarrayCodec`` of
        its own."""
        others = tuple(c for c in codecs if c is not self)
        if others != self._others:
            self._others, self._held = others, None

    def _held_codes(self) -> Codes:
        """How a module's attributes other than numbers and tensors are read
        (``module_held``): through this codec and those it was joined to."""
        if self._held is None:
            others = self._others if self._others is not None else (NdarrayCodec(),)
            self._held = Codes((self, *others), warn=False)
        return self._held

    def forget(self) -> None:
        """Drop the digest memos, so every tensor is hashed afresh when next asked for.

        The memos trust a tensor's version counter, which some writes do not move:
        ``p.data.mul_(2)``, a write through ``p.detach().numpy()``, fused optimizers
        (``Adam(fused=True)``). ``st.module(g)`` (so every ``fit``) calls this."""
        self._memo.clear()
        self._modules.clear()

    def context(self) -> tuple[tuple[str, str], ...] | None:
        """What a node's output depends on besides its state and inputs: the autocast
        dtype of each device type where autocast is on, the default dtype where it is not
        float32 (what ``torch.arange(3.0)`` in a node makes), and the float32 matmul
        precision where it is not full float32 (TF32 or bfloat16 passes, set by
        ``torch.set_float32_matmul_precision`` or per backend, ``torch.backends.cuda.matmul
        .fp32_precision``). None where all are as torch starts, so keys made under the
        defaults do not change."""
        numerics = _numerics()
        if _any_autocast is not None and not _any_autocast():  # (the common case)
            return numerics
        on = tuple(
            (device, str(torch.get_autocast_dtype(device)))
            for device in _AUTOCAST_DEVICES
            if torch.is_autocast_enabled(device)
        )
        return (on + (numerics or ())) or None

    @property
    def rows(self) -> Any:
        """Rows along dim 0, for per-example memory (``somatize.torch.rows.TensorRows``)."""
        return _rows()

    def accepts(self, value: Any) -> bool:
        return isinstance(value, _TENSOR)

    def check(self, value: torch.Tensor) -> None:
        check_tensor(value)

    def chunks(self, value: torch.Tensor) -> Iterable[bytes | memoryview]:
        check_tensor(value)
        if type(value) not in _PLAIN:  # (keyed or stored: checked data may be one, uncached)
            raise subclass_error(value)
        return (_header(value), tensor_bytes(value))

    key = staticmethod(tensor_key)  # digest(t, codecs) of a lone tensor (tensor_keys.py)

    def decode(self, payload: bytes) -> torch.Tensor:
        (n,) = _LEN.unpack_from(payload)
        dtype_name, shape = decode_data(payload[8 : 8 + n])
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a tensor payload names {dtype_name!r}, which is not a torch dtype")
        raw = payload[8 + n :]
        if not raw:
            return empty(shape, dtype)
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
        if not fresh and memo is not None and memo[0] is t and memo[1] == seen:
            return memo[2]
        h = blake3()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(tensor_bytes(t))
        result = h.hexdigest()
        self.hashed += 1
        if seen:
            self._memo.keep(t, seen, result)
        return result

    def fingerprint(self, obj: Any) -> str | None:
        """The digest of a tensor, of a module's structure, modes and state
        (``somatize.torch.fingerprints``), of a generator's state (a node drawing from its
        own: each call a new key, as each draws anew; torch's global generator by name), of a ``torch.jit.ScriptFunction``'s
        code, or the name of a dtype, device, layout or memory format.

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
            if obj is torch.default_generator:  # torch's global one, by name, as torch.randn's
                # draws and random.random's are: code names it to seed it (federated.md's
                # ``torch.default_generator.manual_seed(seed)``), and a remembered run keyed by
                # where it stood missed after an earlier run was recalled instead of drawing
                return "generator:torch.default_generator"
            return f"generator:{blake3(obj.get_state().numpy().tobytes()).hexdigest()}"
        if not isinstance(obj, nn.Module):
            if isinstance(obj, _NAMED):
                return f"{type(obj).__name__}:{obj}"
            return script_function(obj) if isinstance(obj, _SCRIPTED) else None
        return module_fingerprint(self, obj)

    def _remember_module(self, obj: nn.Module, parts: list[Any], result: str) -> None:
        """Keep what ``obj``'s fingerprint ``result`` was made of (see ``fingerprints``)."""
        if len(self._modules) > 1024:  # forget modules that no longer exist
            self._modules = {k: v for k, v in self._modules.items() if v[0]() is not None}
        self._modules[id(obj)] = (weakref.ref(obj), parts, result)


_NAMED = (torch.dtype, torch.device, torch.layout, torch.memory_format)  # enter a state by name
_SCRIPTED = torch.jit.ScriptFunction  # (by its code: ``module_code``)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _numerics() -> tuple[tuple[str, str], ...] | None:
    """The default dtype and float32 matmul precision where they are not torch's defaults."""
    dtype, matmul = torch.get_default_dtype(), _matmul()
    if dtype is torch.float32 and matmul is None:
        return None
    out = () if dtype is torch.float32 else (("default dtype", str(dtype)),)
    return out + (() if matmul is None else (("float32 matmul", matmul),))


# torch >= 2.9 keeps the precision per backend and op (``torch.backends.cuda.matmul
# .fp32_precision = "tf32"``, ``torch.backends.fp32_precision``); its legacy getter
# (``torch.get_float32_matmul_precision``) raises once that API was used.
_fp32 = getattr(torch._C, "_get_fp32_precision_getter", None)
_FULL = ("none", "ieee")  # (unset: full float32, as "ieee")
# (CUDA, CPU) precisions as the legacy names set them: their keys are as they were
_LEGACY = {("tf32", "tf32"): "high", ("tf32", "bf16"): "medium"}


def _matmul() -> str | None:
    """The float32 matmul precision where it is not full float32 (None), read from the
    per-backend settings where torch has them (the CUDA and the CPU (oneDNN) matmul)."""
    if _fp32 is None:
        legacy = torch.get_float32_matmul_precision()
        return None if legacy == "highest" else legacy
    cuda, cpu = _fp32("cuda", "matmul"), _fp32("mkldnn", "matmul")
    if cuda in _FULL and cpu in _FULL:
        return None
    named = _LEGACY.get((cuda, cpu))
    if named is not None:
        return named
    return f"cuda {'ieee' if cuda in _FULL else cuda}, cpu {'ieee' if cpu in _FULL else cpu}"


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)  # (private: may go away)


@functools.cache
def _rows() -> Any:
    from .rows import TensorRows

    return TensorRows()


def default_codecs() -> tuple[TensorCodec, NdarrayCodec]:
    """The codecs ``module(g)`` and the Trainer give a graph: tensors and ndarrays."""
    made = (TensorCodec(), NdarrayCodec())
    made[0].join(made)
    return made
