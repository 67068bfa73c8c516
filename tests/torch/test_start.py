"""Where a run places its module: a device named another way than its tensors report it
(``cpu:0`` and ``cpu``, ``cuda`` and ``cuda:0``) is the same device, and nothing moves."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from somatize.torch.start import place


class Counted(nn.Linear):
    """Counts its ``.to()`` calls (a move walks every module, even when nothing moves)."""

    moves = 0

    def to(self, *args, **kwargs):
        self.moves += 1
        return super().to(*args, **kwargs)


@pytest.mark.parametrize("requested", ["cpu", "cpu:0", torch.device("cpu", 0), None])
def test_a_module_on_the_cpu_asked_for_the_cpu_is_not_moved(requested):
    net = Counted(2, 2)
    assert place(net, requested, 1) == torch.device("cpu")
    assert net.moves == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_module_on_cuda_0_asked_for_cuda_is_not_moved():
    net = Counted(2, 2).to("cuda:0")
    net.moves = 0
    with torch.cuda.device(0):
        device = place(net, "cuda", 1)
    assert device == torch.device("cuda", 0) == net.weight.device
    assert net.moves == 0
    assert place(Counted(2, 2), "cuda", 1).index == torch.cuda.current_device()
