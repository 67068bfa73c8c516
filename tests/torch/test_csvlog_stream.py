"""CSVLog to a path that is not a regular file: os.devnull, a named pipe."""

from __future__ import annotations

import os
import stat
import threading

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.keepers import atomic_write


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def fit(path: str) -> None:
    torch.manual_seed(0)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(3)]
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        watchers=[st.CSVLog(path)],
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Linear()), data, val=data[:1])


def test_a_log_to_devnull_leaves_devnull_a_device():
    """Found by a full run as root: each fit's atomic rewrite renamed a file over
    /dev/null, which stayed a regular file for every program after it."""
    fit(os.devnull)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_log_to_a_named_pipe_streams_its_rows_to_the_reader(tmp_path):
    fifo = tmp_path / "log.csv"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    fit(str(fifo))
    reader.join(30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # (not replaced by a file)
    lines = got[0].decode().splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("kind,step,epoch")]
    assert headers[0] == 0 and len(headers) >= 2  # the header again as columns appear
    assert sum(line.startswith("step,") for line in lines) == 6
    assert sum(line.startswith("eval,") for line in lines) == 2
    assert "val_loss" in lines[headers[-1]]


def test_an_atomic_write_over_a_device_or_a_pipe_is_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="is not a regular file"):
        atomic_write(fifo, b"x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
