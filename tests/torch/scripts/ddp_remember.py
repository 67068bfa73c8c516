"""``st.remember`` around a fit under torchrun, launched by the DDP test as

    torchrun --nproc_per_node=2 ... tests/torch/scripts/ddp_remember.py OUT_DIR

Every rank calls the remembered function with the same arguments (one key); each writes
OUT_DIR/remember-rank<R>-<N>.pt for its N-th job in OUT_DIR (whether it recalled, the
losses and weights). With ``--held S`` the process group's timeout is 4 s and the key's
lock is held for S seconds first, as by another job computing the same run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F

import somatize.torch as st
from somatize import DiskKeeper

sys.path.insert(0, str(Path(__file__).parent))
from ddp_train import data, graph


def train(lr: float) -> st.TrainResult:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
        epochs=1,
        seed=0,
        checkpoint=st.run_checkpointing(),
        options=st.Options(progress=False, shuffle=False),
    ).fit(graph(), data()[0], resume="last")


def hold(remembered: st.Remembered, seconds: float) -> None:
    """Take the run's lock on a descriptor of its own (another job's, as flock sees it) and
    give it back after ``seconds``."""
    import fcntl
    import threading

    d = remembered.store.dir(remembered.key(0.1))
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(seconds, os.close, (fd,)).start()


def main() -> None:
    torch.set_num_threads(1)
    out, rank = Path(sys.argv[1]), int(os.environ["RANK"])
    remembered = st.remember(train, keeper=DiskKeeper(out / "runs"))
    if "--held" in sys.argv:
        import datetime

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
        if rank == 0:
            hold(remembered, float(sys.argv[sys.argv.index("--held") + 1]))
        dist.barrier()
    result = remembered(0.1)
    job = len(list(out.glob(f"remember-rank{rank}-*.pt")))
    torch.save(
        {"recalled": result.recalled, "losses": result.losses, "state": dict(result.state)},
        out / f"remember-rank{rank}-{job}.pt",
    )
    if "--held" in sys.argv:  # the script's own group: it destroys it, as torch asks
        dist.destroy_process_group()  # (left to exit, gloo aborted about one job in eight)


if __name__ == "__main__":
    main()
