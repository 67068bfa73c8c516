"""Models plain DDP needs settings or care for, in a process group the script makes itself
(as ``mp.spawn`` with ``init_process_group(..., world_size=2)`` does: no ``WORLD_SIZE`` in
the environment), launched by ``tests/torch/test_ddp_models.py`` as

    torchrun --nproc_per_node=2 ... tests/torch/scripts/ddp_models.py OUT_DIR

Each rank writes OUT_DIR/models-rank<R>.pt: the planned steps; the notes of the error a
model with a parameter no loss reaches fails with by default; the losses and weights it
trains to with ``Options(find_unused_parameters=True)``; a BatchNorm model's weights and
validation metrics, as a graph and as a module the script wrapped in DDP itself; the cache
counts of a frozen encoder cached per example (each rank its own keeper).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque

sys.path.insert(0, str(Path(__file__).parent))
from ddp_train import data


class Unused(Node):
    """Holds a head it never calls (an auxiliary head, a branch this graph does not take)."""

    def __init__(self) -> None:
        self.used, self.spare = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.used(x)))


class Normed(Node):
    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


class Encoder(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def cached() -> Graph:
    torch.manual_seed(0)
    g = Graph.somatize(Encoder().with_id("enc") >> Head().with_id("head"), keeper=MemoryKeeper())
    return g.freeze("enc").cache("enc", per="example")


def unused() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Unused())


def normed() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Normed())


def trainer(checkpoint: st.Checkpointing | None = None, **options) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.3),
        epochs=2,
        checkpoint=checkpoint,
        options=st.Options(progress=False, shuffle=False, **options),
    )


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")  # the script's own group, from torchrun's variables
    rank = dist.get_rank()
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):  # gone, as under mp.spawn
        del os.environ[name]
    train, val = data()
    got = {"planned": trainer().planned_steps(train)}
    try:
        trainer().fit(unused(), train)
    except RuntimeError as e:
        got["unused_notes"] = list(getattr(e, "__notes__", []))
    ckpt = st.Checkpointing(out / "ckpt")  # rank 0 writes; a second writer would be refused
    fitted = trainer(ckpt, find_unused_parameters=True).fit(unused(), train)
    got["unused"] = {"losses": fitted.losses, "state": dict(fitted.state)}
    fitted = trainer().fit(normed(), train, val=val)
    got["normed"] = {"metrics": fitted.metrics, "state": dict(fitted.state)}
    wrapped = DistributedDataParallel(st.module(normed()))  # as a hand-written loop has it
    fitted = trainer().fit(wrapped, train, val=val)
    got["wrapped"] = {"metrics": fitted.metrics, "state": dict(fitted.state)}
    fitted = trainer().fit(cached(), train)
    got["cache"] = {"cache": fitted.cache, "examples": fitted.num_examples}
    torch.save(got, out / f"models-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
