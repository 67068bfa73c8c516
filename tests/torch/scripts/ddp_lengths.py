"""Data of different lengths on the ranks, launched by ``tests/torch/test_rank_lengths.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_lengths.py OUT_DIR

(found by an outside audit):

* a list of 20 batches on rank 0 and 14 on rank 1, or a shuffled DataLoader over 320
  rows on rank 0 and 200 on rank 1: hung until gloo's 30-minute timeout; now a
  ``SettingError`` on every rank, before any step;
* a val list of 3 batches on rank 0 and 1 on rank 1 (in ``fit`` and ``evaluate``): a
  different metric, silently; now a ``SettingError`` on every rank;
* 21 batches on 2 ranks: the last dropped each epoch, silently; now a warning on rank 0;
* a DataLoader over 331 rows: ``num_examples`` counted the DistributedSampler's pad (332);
* ``seed=rank`` (found by a torchrun persona audit): each rank's DistributedSampler drew
  another permutation, so the shares overlapped, silently; now a ``SettingError`` on
  every rank.

The process group is this script's, so it outlives the fits that raise. Every rank
writes what it got to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize.errors import SettingError

torch.set_num_threads(1)


def rows(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def batches(n: int, size: int = 16) -> list:
    x, y = rows(n)
    return [(x[i : i + size], y[i : i + size]) for i in range(0, n, size)]


def trainer(seed: int = 0) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        seed=seed,
        options=st.Options(progress=False),
    )


def raised(fn) -> str:
    try:
        fn()
    except SettingError as e:
        return str(e)
    return ""


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    got: dict = {}
    net = nn.Linear(4, 3)
    got["list"] = raised(lambda: trainer().fit(net, batches(16 * (20 if rank == 0 else 14))))
    loader = DataLoader(
        TensorDataset(*rows(320 if rank == 0 else 200)), batch_size=16, shuffle=True
    )
    got["loader"] = raised(lambda: trainer().fit(net, loader))
    val = batches(120, 40)[: 3 if rank == 0 else 1]
    got["val"] = raised(lambda: trainer().fit(net, batches(64), val={"held": val}))
    got["evaluate"] = raised(lambda: trainer().evaluate(net, val))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted = trainer().fit(net, batches(330))  # 21 batches: 20 of 16, the last of 10
    got["dropped"] = [str(w.message) for w in caught]
    got["dropped_examples"] = fitted.num_examples
    odd = DataLoader(TensorDataset(*rows(331)), batch_size=16, shuffle=True)
    got["odd_examples"] = trainer().fit(net, odd).num_examples
    got["seed"] = raised(lambda: trainer(seed=rank).fit(net, odd))
    dist.destroy_process_group()
    torch.save(got, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
