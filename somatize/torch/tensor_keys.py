"""The key of a lone tensor (``digest(t, codecs)``): keyed blake3 over its raw bytes.

::

    key(t)              = blake3(raw bytes of t, key=layout_key(dtype, shape))
    layout_key(d, s)    = blake3(encode(("somatize.tensor/2", dtype name, shape)))  (32 bytes)

The raw bytes are hashed alone, so 1 KiB of data is one blake3 chunk, as for raw blake3
of it; dtype and shape enter through the 32-byte key, derived once per pair and kept.
Tensors of different dtype or shape are hashed under different keys, so their keys differ
even where their bytes are the same; keyed blake3 is a domain of its own, so no key of
plain data (unkeyed blake3 of an encoding) equals a tensor's. It is how per-example rows
are keyed too (``somatize/rows.py``: a key over the node and the row layout).

Until this scheme (``somatize.tensor/2``) a lone tensor's key was blake3 of its canonical
encoding (tag, size, dtype and shape header, bytes), which took a second blake3 chunk
for a 1 KiB tensor; a cache built then misses once on tensor inputs, never wrongly hits.
A tensor *inside* a list, tuple or dict still enters its value's key by its encoding.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
from blake3 import blake3

from ..errors import ValueConversionError
from ..values import encode

__all__ = ["TENSOR_KEY_VERSION", "check_tensor", "layout_key", "tensor_bytes", "tensor_key"]

TENSOR_KEY_VERSION = "somatize.tensor/2"

_STRIDED = torch.strided
_TENSOR = torch.Tensor
# (dtype, shape) -> the layout key
_LAYOUT_KEYS: dict[tuple[torch.dtype, tuple[int, ...]], bytes] = {}
# (dtype, shape) -> a blake3 hasher under the layout key, nothing fed yet, and the ctypes
# array type of the payload, for tensors of at most 64 KiB of a dtype without a conj bit
# (not complex) keyed once by the slow road: what ``tensor_key`` needs to read a tensor's
# bytes through its data pointer and hash them (a copy of the hasher costs less than making
# one under a key, by about 0.2 µs: an eighth of hashing 1 KiB)
_SMALL: dict[tuple[torch.dtype, tuple[int, ...]], tuple[blake3, Any]] = {}


# The tensor types that are data: a subclass's type, and what it carries beside its
# values, would enter no key and not survive a store
_PLAIN = frozenset(
    {torch.Tensor, torch.nn.Parameter, *([torch.nn.Buffer] if hasattr(torch.nn, "Buffer") else [])}
)


def subclass_error(value: torch.Tensor) -> ValueConversionError:
    """The error for a tensor subclass met as data (a key, a stored row)."""
    name = type(value).__qualname__
    return ValueConversionError(
        f"the torch.Tensor subclass {name}: its type (and whatever it carries beside its "
        f"values) would enter no key, and a stored copy comes back a plain tensor, so a "
        f"cached node would serve one {name}'s output for another, or for a plain tensor of "
        "the same values — pass x.as_subclass(torch.Tensor) as data (and what the subclass "
        "carries as data of its own), or wrap it in Opaque(...) and cache no node it reaches"
    )


def layout_key(dtype: torch.dtype, shape: tuple[int, ...]) -> bytes:
    """The blake3 key a tensor of ``dtype`` and ``shape`` is hashed under (kept per pair)."""
    k = _LAYOUT_KEYS.get((dtype, shape))
    if k is None:
        name = str(dtype).removeprefix("torch.")
        k = blake3(encode((TENSOR_KEY_VERSION, name, tuple(shape)))).digest()
        if len(_LAYOUT_KEYS) < 4096:
            _LAYOUT_KEYS[dtype, tuple(shape)] = k
    return k


def check_tensor(value: torch.Tensor) -> None:
    """Raise ``ValueConversionError`` (reason and fix) unless ``value`` can be data."""
    if (
        value.is_cpu
        and not value.requires_grad
        and value.layout is _STRIDED
        and not value.is_quantized
        and not value.is_nested  # (a strided nested tensor has no sizes: .shape raises)
    ):
        return  # the common case, in five attribute reads
    if value.is_nested:  # (torch.nested, either layout: to_dense() refuses both)
        n = value.size(0)
        raise ValueConversionError(
            f"a nested tensor (torch.nested, {value.layout}) of {n} sequence{'s' * (n != 1)} "
            f"on {value.device}; only dense tensors with storage are data — pad it, "
            "nt.to_padded_tensor(0.0) (with a mask of the lengths beside it), or wrap it in "
            "Opaque(...)"
        )
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
    if value.layout != _STRIDED or value.is_quantized or value.device.type == "meta":
        raise ValueConversionError(
            f"a {value.layout} tensor on {value.device}; only dense tensors with storage are "
            "data — convert it (.to_dense()) or wrap it in Opaque(...)"
        )


def tensor_bytes(t: torch.Tensor) -> memoryview:
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


def tensor_key(value: torch.Tensor) -> str | None:
    """The key of a lone tensor (``TensorCodec.key``), or None where it cannot be data (the
    general path of ``digest`` then words why) or has no storage to read (a functorch
    batched tensor).

    A small tensor of a (dtype, shape) keyed before is read through its data pointer: five
    checks stand in for ``numpy()``'s, and no array is made. A tensor of any layout other
    than strided has no data pointer (``data_ptr()`` raises), so its layout is not read."""
    if type(value) is _TENSOR:
        try:
            known = _SMALL.get((value.dtype, value.shape))
            if (
                known is not None
                and value.is_cpu
                and not value.requires_grad
                and value.is_contiguous()
                and not value.is_neg()  # (no conj bit to test: complex dtypes are not kept)
            ):
                ptr = value.data_ptr()  # (raises for a sparse or mkldnn tensor)
                if ptr:  # (0: a tensor with no memory, such as a ZeroTensor)
                    keyed, raw = known  # a hasher under the layout key, a ctypes array type
                    # (.raw copies the bytes under the GIL, while value is held)
                    return keyed.copy().update(raw.from_address(ptr).raw).digest().hex()
        except RuntimeError:  # (a tensor without storage: sparse, functorch, nested)
            return None
    return _slow_key(value)


def _slow_key(value: torch.Tensor) -> str | None:
    """``tensor_key`` through ``check_tensor`` and ``tensor_bytes`` (any tensor that is
    data: on a GPU, a view, a conj view); keeps what the pointer road needs. None for a
    subclass: the general path words why it is not data (``subclass_error``)."""
    if type(value) not in _PLAIN:
        return None
    try:
        check_tensor(value)
        view = tensor_bytes(value)
    except (ValueConversionError, TypeError, RuntimeError):
        return None
    shape = tuple(value.shape)
    k = layout_key(value.dtype, shape)
    nbytes = view.nbytes
    if (
        0 < nbytes <= 65536
        and not value.dtype.is_complex
        and len(_SMALL) < 4096
        and (value.dtype, shape) not in _SMALL
    ):
        _SMALL[value.dtype, shape] = (blake3(key=k), ctypes.c_char * nbytes)
    return blake3(view, key=k).hexdigest()
