"""A frozen encoder cached per example on a DiskKeeper: the subject of the sharing and kill tests.

    python tests/torch/scripts/rows_worker.py CACHE_DIR START STOP     # rows START..STOP of DATA
    python tests/torch/scripts/rows_worker.py CACHE_DIR --forever      # new batches until killed

Prints ``ready`` once the graph is built, then ``computed N`` (rows the encoder ran on)
for a range, or ``batch I`` after each stored batch with ``--forever`` (batch I holds the
rows of ``batch_rows(I)``).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque

DATA = torch.randn(256, 6, generator=torch.Generator().manual_seed(7))


class Enc(Node):
    rows = 0

    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32))

    def forward(self, x, ctx):
        Enc.rows += x.shape[0]
        return Done(Opaque(self.net(x)))


def graph(cache_dir: str) -> Graph:
    torch.manual_seed(0)
    g = Graph(keeper=DiskKeeper(cache_dir)).node("enc", Enc()).freeze("enc")
    g.cache("enc", per="example")
    st.module(g)
    return g


def batch_rows(i: int) -> torch.Tensor:
    return torch.randn(16, 6, generator=torch.Generator().manual_seed(1000 + i))


def main() -> None:
    torch.set_num_threads(1)
    g = graph(sys.argv[1])  # (this module imported by name: keys name the class as the tests do)
    print("ready", flush=True)
    if sys.argv[2] == "--forever":
        i = 0
        while True:
            g.forward(batch_rows(i))
            print(f"batch {i}", flush=True)
            i += 1
    g.forward(DATA[int(sys.argv[2]) : int(sys.argv[3])])
    print(f"computed {Enc.rows}", flush=True)


if __name__ == "__main__":
    from tests.torch.scripts import rows_worker

    rows_worker.main()
