"""Under ``torchrun --nproc_per_node=2``, a step whose ranks hold batches of different
sizes equals one process stepping on their batches joined (DDP alone would average the
ranks' mean gradients, weighing the examples of the smaller batch more)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from .test_ddp import said, torchrun

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import ddp_uneven


def joined(batches, per_step):
    """One batch per step of 2 ranks: rank r takes batches r, r + 2, ...; a step takes
    ``per_step`` of each rank's, so ``2 * per_step`` consecutive batches."""
    width = 2 * per_step
    return [
        (
            torch.cat([b[0] for b in batches[i : i + width]]),
            torch.cat([b[1] for b in batches[i : i + width]]),
        )
        for i in range(0, len(batches), width)
    ]


@pytest.mark.slow
def test_ranks_with_batches_of_different_sizes_step_as_one_process_on_them_joined(tmp_path):
    assert torchrun(tmp_path, script="ddp_uneven.py") == 0, said(tmp_path)
    ranks = [torch.load(tmp_path / f"uneven-rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name, kw in ddp_uneven.WAYS.items():
        single = ddp_uneven.trainer().fit(
            ddp_uneven.graph(), joined(ddp_uneven.data(), kw.get("accumulate", 1))
        )
        for got in ranks:
            torch.testing.assert_close(
                torch.tensor(got[name]["losses"]), torch.tensor(single.losses), msg=name
            )
            for key, value in single.state.items():
                torch.testing.assert_close(got[name]["state"][key], value, msg=f"{name} {key}")
