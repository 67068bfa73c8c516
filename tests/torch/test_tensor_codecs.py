"""Tensor and ndarray codecs: keys over dtype, shape and bytes; no copies; refusals with the
fix in the message."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from blake3 import blake3

from somatize import Done, Graph, Node, ValueConversionError, digest, encode
from somatize.torch import NdarrayCodec, TensorCodec
from tests.torch.codec_helpers import CODECS, key

# -- keys -------------------------------------------------------------------------------


def test_tensor_key_covers_dtype_shape_and_bytes():
    t = torch.arange(6, dtype=torch.float32)
    same_bytes = [t, t.reshape(2, 3), t.reshape(3, 2), t.view(torch.int32), t.view(torch.uint8)]
    assert len({key(v) for v in same_bytes}) == len(same_bytes)
    changed = t.clone()
    changed[5] = 6.0
    assert key(changed) != key(t)
    assert key(t.clone()) == key(t)  # content, not identity
    nc = torch.arange(12.0).reshape(3, 4).T
    assert not nc.is_contiguous()
    assert key(nc) == key(nc.contiguous())
    assert key(torch.tensor(1.0)) != key(torch.tensor([1.0]))  # 0-d vs one element
    assert key(torch.tensor([0.0])) != key(torch.tensor([-0.0]))


def test_tensor_digest_of_held_state_covers_dtype_shape_and_bytes():
    c = TensorCodec()
    t = torch.arange(6, dtype=torch.float32)
    variants = [t, t.reshape(2, 3), t.view(torch.int32), t + 1]
    assert len({c.digest(v) for v in variants}) == len(variants)


def test_ndarray_key_covers_dtype_shape_bytes_and_scalarness():
    a = np.arange(6, dtype=np.float32)
    same_bytes = [a, a.reshape(2, 3), a.view(np.int32), a.astype(">f4").view("<f4")]
    assert len({key(v) for v in same_bytes}) == len(same_bytes)
    assert key(np.float32(1)) != key(np.array(1, np.float32)) != key(np.array([1], np.float32))
    assert key(np.float32(1)) != key(torch.tensor(1.0))  # the codec tag is in the key
    assert key(a[::2]) == key(np.ascontiguousarray(a[::2]))


def test_key_is_keyed_blake3_over_the_raw_bytes_under_a_key_of_dtype_and_shape():
    """Differential against raw blake3: the raw bytes, keyed by dtype and shape, no pickle;
    the encoding a keeper stores is header and raw bytes."""
    t = torch.randn(3, 5).T  # non-contiguous
    raw = t.contiguous().numpy().tobytes()
    layout = blake3(encode(("somatize.tensor/2", "float32", (5, 3)))).digest()
    assert key(t) == blake3(raw, key=layout).hexdigest()
    header = encode(("float32", (5, 3)))
    payload = struct.pack(">Q", len(header)) + header + raw
    tag = b"torch.tensor"
    framed = b"c" + struct.pack(">Q", len(tag)) + tag + struct.pack(">Q", len(payload))
    assert encode(t, CODECS) == framed + payload
    assert digest([t], CODECS) == blake3(encode([t], CODECS)).hexdigest()  # inside: encoded
    assert TensorCodec().digest(t) == blake3(b"torch.float32(5, 3)" + raw).hexdigest()


def test_tensor_bytes_reach_blake3_without_a_copy():
    t = torch.zeros(4, dtype=torch.float32)
    _, raw = TensorCodec().chunks(t)
    assert isinstance(raw, memoryview) and raw.nbytes == 16
    t[0] = 1.0  # the view sees the tensor's own memory
    assert bytes(raw[:4]) == struct.pack("<f", 1.0)
    a = np.zeros(3, dtype=np.int16)
    _, raw_a = NdarrayCodec().chunks(a)
    a[1] = 7
    assert bytes(raw_a) == a.tobytes()


# -- refusals ---------------------------------------------------------------------------


def test_tensor_that_requires_grad_is_refused_as_data():
    t = torch.ones(2, requires_grad=True)
    with pytest.raises(
        ValueConversionError,
        match=r"wrap it in Opaque.*or detach it.*a detached output trains nothing.*freeze",
    ):
        encode({"x": [t]}, CODECS, "the output of node 'enc'")
    with pytest.raises(ValueConversionError, match=r"the output of node 'enc' at \['x'\]\[0\]"):
        digest({"x": [t]}, CODECS, "the output of node 'enc'")
    assert key(t.detach()) == key(torch.ones(2))  # detached, it is data


def test_graph_input_that_requires_grad_is_refused_when_passed_as_data():
    from somatize.torch import module

    class Id(Node):
        def forward(self, x, ctx):
            return Done(x)

    g = Graph.somatize(Id())
    module(g)  # equips the graph with the torch codecs
    with pytest.raises(ValueConversionError, match=r"the graph input.*Opaque"):
        g.forward(torch.ones(2, requires_grad=True))
    assert torch.equal(g.forward(torch.ones(2)), torch.ones(2))


def test_sparse_and_meta_tensors_and_object_arrays_are_refused():
    with pytest.raises(ValueConversionError, match="to_dense"):
        key(torch.eye(2).to_sparse())
    with pytest.raises(ValueConversionError, match="meta"):
        key(torch.empty(2, device="meta"))
    with pytest.raises(ValueConversionError, match="objects"):
        key(np.array([{}, 1], dtype=object))


def test_tensors_are_not_data_without_the_codecs():
    with pytest.raises(ValueConversionError, match=r"somatize\.torch"):
        digest(torch.ones(1))


def test_decode_refuses_a_payload_naming_no_dtype():
    c = TensorCodec()
    header = encode(("load", (1,)))
    with pytest.raises(ValueError, match="not a torch dtype"):
        c.decode(struct.pack(">Q", len(header)) + header + b"\0")


def test_a_payload_naming_a_shape_without_its_bytes_is_refused():
    """Found by an outside audit: a tensor payload with a header and no bytes decoded to
    ``torch.empty(shape)`` — memory never written, of a size the header names."""
    (codec,) = [c for c in CODECS if isinstance(c, TensorCodec)]
    header = encode(("float32", (1000, 3)))
    with pytest.raises(ValueError, match=r"shape \(1000, 3\) holds no bytes"):
        codec.decode(struct.pack(">Q", len(header)) + header)
    header = encode(("float32", (0, 3)))  # no elements: no bytes, as written
    assert codec.decode(struct.pack(">Q", len(header)) + header).shape == (0, 3)
