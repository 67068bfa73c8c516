"""Per-example memory on a placed node: hits arrive on the node's device (CPU, CUDA), and a
node on another host keys its rows in that host's keeper."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import somatize.torch as st
from somatize import MemoryKeeper
from tests.torch.rows_graphs import Encoder, data, graph


def test_hits_arrive_on_the_placed_device():
    g = graph()
    g.place("enc", device="cpu")
    st.module(g)
    x = data().tensors[0][:3]
    g.forward(x)
    out = g.forward(x)
    assert out.device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hits_arrive_on_cuda_where_the_node_runs():  # pragma: no cover - GPU machines only
    g = graph()
    m = st.module(g).to("cuda")
    x = data().tensors[0][:8].cuda()
    first = m(x)
    again = m(x)
    assert again.device.type == "cuda"
    assert_close(again, first)


def test_a_node_cached_per_example_on_another_host_keys_rows_there():
    from somatize.transports import InProcess

    box_keeper = MemoryKeeper()
    g = graph().place("enc", host="box")
    st.module(g)
    x = data().tensors[0][:5]
    ref = st.module(graph(cached=False))(x)
    Encoder.rows = 0
    first = g.forward(x, transports={"box": InProcess(box_keeper)})
    again = g.forward(x[[4, 0, 2]], transports={"box": InProcess(box_keeper)})
    assert Encoder.rows == 5 and len(box_keeper) == 5  # one entry a row, in the box's keeper
    assert_close(first, ref.detach())
    assert_close(again, ref.detach()[[4, 0, 2]])
