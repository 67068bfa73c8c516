"""A campaign: the digits recipe over five seeds on a process pool, remembered, summarised.

    python recipes/campaign.py                 # 5 seeds on 2 workers
    python recipes/campaign.py                 # again: every run recalled, in a moment
    python recipes/campaign.py --seeds 10 --workers 4 --epochs 20

A campaign has no type of its own: it is ``pool.map`` over a function that trains
one run and returns its ``TrainResult``, then ``summarize`` over the list. The pool
comes from ``st.executor()``: workers forked (or started by a forkserver where forking
is unsafe) with torch preloaded, and one torch thread each. The function is wrapped in ``st.remember``: a run whose code and
arguments are unchanged is recalled from ``runs/campaign`` instead of trained again,
and a run killed midway (Ctrl-C, a pre-empted machine) resumes from its last
checkpoint — in a directory named by its key — when the campaign is run again.
``somatize runs ls --dir runs/campaign`` lists them. TensorBoard logs go to
``runs/campaign/seed-N`` (``tensorboard --logdir runs/campaign`` compares them).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the sibling recipes importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch.nn import functional as F

import somatize.torch as st
from recipes import digits
from somatize import DiskKeeper


def run_seed(seed: int, epochs: int = 20, logs: str = "runs/campaign") -> st.TrainResult:
    """One run of the digits recipe (what each worker executes)."""
    torch.manual_seed(seed)
    g = digits.make_graph()
    train_batches, val_batches = digits.load_data(seed)
    steps = epochs * len(train_batches)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-4),
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps),
        epochs=epochs,
        metrics={"acc": st.accuracy},
        checkpoint=st.run_checkpointing(every_steps=100),  # named by this run's key
        watchers=[st.TensorBoard(Path(logs) / f"seed-{seed}")],
        pruner=st.Patience("val_acc", patience=8, mode="max"),  # early stopping
        seed=seed,
        options=st.Options(monitor="val_acc", mode="max", progress=False),
    )
    return trainer.fit(g, train_batches, val=val_batches, resume="last")


def campaign(seeds: int, workers: int, epochs: int, out: str) -> list[st.RememberedResult]:
    train = st.remember(run_seed, keeper=DiskKeeper(out), exclude=("logs",))
    with st.executor(workers=workers) as pool:  # or dask: Client(...).get_executor()
        return list(pool.map(train, range(seeds), [epochs] * seeds, [out] * seeds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out", default="runs/campaign", help="remembered runs and logs")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = campaign(args.seeds, args.workers, args.epochs, args.out)
    summary = st.summarize(results, "val_acc")
    print(summary)
    recalled = sum(r.recalled for r in results)
    print(
        f"\nval_acc = {summary.mean:.4f} ± {summary.std:.4f} over {summary.n} seeds "
        f"({time.perf_counter() - start:.1f}s on {args.workers} workers; "
        f"{recalled} of {len(results)} runs recalled, {len(results) - recalled} trained)"
    )
    return 0 if summary.min >= digits.TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
