"""``somatize cache verify`` on a store of per-example rows: rows are judged as rows (kept
when sound, removed when their layout does not give their length), never as values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque
from somatize.cli import main


class Enc(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(3, 2)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


def fit(path: Path) -> dict[str, dict[str, int]]:
    torch.manual_seed(0)
    g = Graph.somatize(Enc().with_id("enc") >> Head(), keeper=DiskKeeper(path))
    g.freeze("enc").cache("enc", per="example")
    x, y = torch.randn(32, 4, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 2
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=1,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]).cache


def test_cache_verify_keeps_sound_rows_and_removes_a_row_its_layout_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cache"
    assert fit(path) == {"enc": {"hits": 0, "misses": 32}}
    assert main(["cache", "verify", "--dir", str(path)]) == 0
    assert capsys.readouterr().out.startswith("0 corrupt entries removed; 32 entries")
    keeper = DiskKeeper(path)
    bad = sorted(keeper.keys())[0]
    entry = keeper.get(bad)
    assert entry is not None and entry[:4] == b"SMZ2"
    keeper.put(bad, entry[:-4])  # checksummed as written (over the packed copy), but short
    assert main(["cache", "verify", "--dir", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"removed corrupt entry {bad}" in out and "1 corrupt entry removed" in out
    assert DiskKeeper(path).get(bad) == entry  # the packed copy, sound, is what is left
    assert fit(path) == {"enc": {"hits": 32, "misses": 0}}
