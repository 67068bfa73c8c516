"""``run_checkpointing()`` outside a remembered run: a temporary directory that goes with
the process that made it (``somatize/torch/remember.py``)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

import somatize.torch as st

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn
    import somatize.torch as st
    from somatize import Done, Graph, Node, Opaque

    class Linear(Node):
        def __init__(self):
            self.lin = nn.Linear(4, 3)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))] * 2
    for seed in range(2):  # a sweep of plain calls, each checkpointing
        ckpt = st.run_checkpointing(every_steps=1)
        result = st.Trainer(
            loss=nn.functional.cross_entropy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            checkpoint=ckpt, seed=seed, options=st.Options(progress=False),
        ).fit(Graph.somatize(Linear()), data, resume="last")
        assert result.checkpoint.startswith(str(ckpt.dir))  # there while the process runs
        print(ckpt.dir)
    """
)


@pytest.mark.slow
def test_a_plain_calls_checkpoints_go_when_the_process_exits():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    dirs = done.stdout.split()
    assert len(dirs) == 2
    # before: every plain call left its directory of checkpoints in the temporary folder
    assert not [d for d in dirs if os.path.exists(d)]


def _exit() -> None:
    pass


def test_a_forked_child_leaves_its_parents_directory():
    path = st.run_checkpointing().dir
    child = multiprocessing.get_context("fork").Process(target=_exit)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert os.path.isdir(path)  # removed by the process that made it, at its exit only
