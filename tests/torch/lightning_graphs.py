"""The tiny graph, data and CPU Lightning Trainer the LightningGraph tests share
(tests/torch/test_lightning_*.py; import it after ``pytest.importorskip("lightning")``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.torch.lightning import LightningGraph

SGD = 0.5


class Hidden(Node):
    def __init__(self, i: int, o: int):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        h = torch.relu(self.lin(x))
        return Done(Opaque(h), metrics={"mean": h.detach().mean()})


class Out(Node):
    def __init__(self, i: int, o: int):
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def _graph(seed: int = 0) -> Graph:
    torch.manual_seed(seed)
    return Graph.somatize(Hidden(8, 16) >> Out(16, 3))


def _tensors(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    return x, x[:, :3].argmax(dim=1)


def _loader(n: int = 64, seed: int = 0, batch: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(*_tensors(n, seed)), batch_size=batch)


def _lg(g: Graph, lr: float = SGD, **kw) -> LightningGraph:
    return LightningGraph(
        g,
        loss=nn.functional.cross_entropy,
        optimizer=kw.pop("optimizer", lambda ps: torch.optim.SGD(ps, lr=lr)),
        metrics={"acc": st.accuracy},
        **kw,
    )


def _trainer(root: Path, **kw) -> L.Trainer:
    callbacks = kw.pop("callbacks", [])
    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
        "log_every_n_steps": 1,
        "default_root_dir": str(root),
        "enable_checkpointing": any(isinstance(c, ModelCheckpoint) for c in callbacks),
        "callbacks": callbacks,
    }
    settings.update(kw)
    return L.Trainer(**settings)


def _assert_same_state(a, b, **tol) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], **(tol or {"rtol": 1e-6, "atol": 1e-7}), msg=k)
