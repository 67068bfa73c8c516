"""How a DDP rank gets its share of the training data, launched by the DDP test as

    torchrun --nproc_per_node=2 ... tests/torch/scripts/ddp_data.py OUT_DIR W1_CKPT_DIR

Several small fits in one job: DataLoaders with samplers of their own (a subset, weights,
a batch sampler, one that draws differently on each rank), iterables without a length,
and resuming checkpoints that one process wrote (``one_process_checkpoints``). The script
creates the process group itself, so the fits share it. Each rank writes what it saw to
OUT_DIR/data-rank<R>.pt.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from ddp_train import graph  # (beside this script) Linear(4, 8) >> Tanh >> Linear(8, 3)
from torch.nn import functional as F
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

import somatize.torch as st
from somatize.errors import CheckpointError, SettingError
from somatize.torch import ddp as ddp_runtime

ROWS = 64
WEIGHTS = [1.0] * 32 + [0.0] * 32  # rows 32..63 are held out


class Rows(Dataset):
    """64 rows; reading one adds noise drawn from the global RNG (rank 1 draws twice as
    many numbers, so the ranks' streams differ) and records its index."""

    def __init__(self, rank: int) -> None:
        gen = torch.Generator().manual_seed(3)
        self.x, self.y = (
            torch.randn(ROWS, 4, generator=gen),
            torch.randint(0, 3, (ROWS,), generator=gen),
        )
        self.rank, self.seen = rank, []

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i):
        self.seen.append(int(i))
        for _ in range(self.rank + 1):
            noise = torch.randn(4) * 0.01
        return self.x[i] + noise, self.y[i]


class Buckets(Sampler):
    """A batch sampler of one's own: 9 batches of 4 rows, in a fixed order."""

    def __iter__(self):
        return iter([list(range(4 * b, 4 * b + 4)) for b in (8, 0, 7, 1, 6, 2, 5, 3, 4)])

    def __len__(self) -> int:
        return 9


class PerRank(Sampler):
    """Draws another permutation on each rank: not shardable by taking every world-th."""

    def __iter__(self):
        gen = torch.Generator().manual_seed(int(os.environ["RANK"]))
        return iter(torch.randperm(32, generator=gen).tolist())

    def __len__(self) -> int:
        return 32


def batches(n: int) -> list:
    gen = torch.Generator().manual_seed(4)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


class Stream:
    """A re-iterable of batches with no length."""

    def __init__(self, n: int) -> None:
        self.data = batches(n)

    def __iter__(self):
        return iter(self.data)


class RowStream(IterableDataset):
    def __iter__(self):
        for x, y in batches(5):
            yield from zip(x, y)


class Targets:
    """cross_entropy, recording each step's targets (which batch a rank trained on);
    raises at call ``crash`` on every rank alike."""

    def __init__(self, crash: int = 0) -> None:
        self.seen, self.crash = [], crash

    def __call__(self, output, y):
        self.seen.append(y.tolist())
        if len(self.seen) == self.crash:
            raise RuntimeError(f"crashing at call {self.crash}, as asked")
        return F.cross_entropy(output, y)


def fit(train, *, loss=None, epochs=2, ckpt=None, resume=None, every=None, nonfinite="raise"):
    trainer = st.Trainer(
        loss=loss if loss is not None else F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        checkpoint=st.Checkpointing(ckpt, every_steps=every) if ckpt is not None else None,
        options=st.Options(progress=False, nonfinite=nonfinite),
    )
    return trainer.fit(graph(), train, resume=resume)


def one_process_checkpoints(where: Path) -> None:
    """In one process: a checkpoint in mid-epoch (step 3, batch 3 of 8) and at the epoch's
    end (step 8)."""
    fit(batches(8), epochs=1, ckpt=where, every=3)


def garbage_parameters() -> int:
    """How many parameters sit in reference cycles no one can reach (then freed)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sum(isinstance(o, torch.nn.Parameter) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def main() -> None:
    torch.set_num_threads(1)
    out, w1 = Path(sys.argv[1]), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")  # before the fits: the Trainer then leaves it alone
    seen: dict = {}
    for name, sampler in (
        ("subset", SubsetRandomSampler(range(32))),
        ("weighted", WeightedRandomSampler(WEIGHTS, 32)),
    ):
        rows = Rows(rank)
        result = fit(DataLoader(rows, batch_size=4, sampler=sampler))
        seen[name] = {"rows": rows.seen, "steps": result.steps, "state": dict(result.state)}
    rows = Rows(rank)
    result = fit(DataLoader(rows, batch_sampler=Buckets()), epochs=1)
    seen["batch_sampler"] = {"rows": rows.seen, "steps": result.steps}
    for name, train in (
        ("stream", Stream(5)),
        ("row_stream", DataLoader(RowStream(), batch_size=8)),
        ("uneven", Stream(3 + 2 * rank)),
    ):
        targets = Targets()
        result = fit(train, loss=targets)
        seen[name] = {"targets": targets.seen, "steps": result.steps, "n": result.num_examples}
    # without the non-finite check (whose reduction counts every rank's examples)
    seen["stream_ignore"] = {"n": fit(Stream(5), epochs=3, nonfinite="ignore").num_examples}
    try:
        fit(DataLoader(Rows(rank), batch_size=4, sampler=PerRank()))
    except SettingError as e:
        seen["per_rank_error"] = str(e)
    # exact resume of a wrapped sampler: an uninterrupted run, and one crashed at step 3
    loader = lambda: DataLoader(Rows(rank), batch_size=4, sampler=SubsetRandomSampler(range(32)))  # noqa: E731
    whole = fit(loader(), ckpt=out / "whole", every=2)
    with contextlib.suppress(RuntimeError):
        fit(loader(), loss=Targets(crash=3), ckpt=out / "crashed", every=2)
    resumed = fit(loader(), ckpt=out / "crashed", every=2, resume="last")
    seen["resume"] = {
        "whole": (whole.losses, dict(whole.state)),
        "resumed": (resumed.losses, dict(resumed.state)),
    }
    # checkpoints one process wrote: in mid-epoch refused, at an epoch's end resumed
    try:
        fit(batches(8), epochs=1, ckpt=w1, resume=str(w1 / "step-000000003.ckpt"))
    except CheckpointError as e:
        seen["other_world_error"] = str(e)
    result = fit(batches(8), epochs=2, ckpt=w1, resume=str(w1 / "step-000000008.ckpt"))
    seen["other_world_epoch_end"] = {"steps": result.steps, "epochs": result.epochs}
    # What runs at exit, registered by the first fit on this (the script's own) group,
    # collects what the fit that raised left in reference cycles (its graph, its
    # parameters, with DDP's hooks on them) while the interpreter is whole: freed in its
    # teardown instead, after the group, gloo aborted the job ("terminate called without
    # an active exception")
    seen["exit_registered"] = ddp_runtime._at_exit
    ddp_runtime._exit()
    seen["garbage_parameters"] = garbage_parameters()
    torch.save(seen, out / f"data-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
