"""A campaign: the digits recipe over five seeds on a process pool, summarised.

    python recipes/campaign.py                 # 5 seeds on 2 workers
    python recipes/campaign.py --seeds 10 --workers 4 --epochs 20

A campaign has no type of its own: it is ``pool.map`` over a function that trains
one run and returns its ``TrainResult``, then ``summarize`` over the list. The pool
comes from ``st.executor()``: forkserver workers with torch preloaded and one torch
thread each. Each run writes its checkpoints and TensorBoard logs under
``runs/campaign/seed-N`` (``tensorboard --logdir runs/campaign`` compares them).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the sibling recipes importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import somatize.torch as st
from recipes import digits


def run_seed(seed: int, epochs: int = 20, out: str = "runs/campaign") -> st.TrainResult:
    """One run of the digits recipe (what each worker executes)."""
    return digits.train(seed=seed, epochs=epochs, out=Path(out) / f"seed-{seed}", progress=False)


def campaign(seeds: int, workers: int, epochs: int, out: str) -> list[st.TrainResult]:
    with st.executor(workers=workers) as pool:  # or dask: Client(...).get_executor()
        return list(pool.map(run_seed, range(seeds), [epochs] * seeds, [out] * seeds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out", default="runs/campaign")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = campaign(args.seeds, args.workers, args.epochs, args.out)
    summary = st.summarize(results, "val_acc")
    print(summary)
    print(
        f"\nval_acc = {summary.mean:.4f} ± {summary.std:.4f} over {summary.n} seeds "
        f"({time.perf_counter() - start:.1f}s on {args.workers} workers)"
    )
    return 0 if summary.min >= digits.TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
