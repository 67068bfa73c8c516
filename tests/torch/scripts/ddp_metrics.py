"""Evaluation and logging under DDP, launched by ``tests/torch/test_ddp_metrics.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_metrics.py OUT_DIR

A fit whose graph reports a node metric, with a metric object of one's own (``Hits``,
with ``merge``) and two validation sets, one of a single batch (so rank 1 evaluates
none of it), logged by ``CSVLog`` and ``TensorBoard`` (rank 0 only). Then a metric
object without ``merge``, which ``fit`` and ``evaluate`` must refuse. The script makes
the process group itself, so the Trainer neither makes nor destroys one, and
``evaluate`` runs under it too. Every rank writes what it got to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError


class Hidden(Node):
    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        return Done(Opaque(torch.tanh(self.lin(x))))


class Scored(Node):
    """A head that reports its mean confidence, a node metric."""

    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        logits = self.lin(x)
        conf = logits.detach().softmax(-1).amax(-1).mean()
        return Done(Opaque(logits), metrics={"conf": conf})


class Hits:
    """The fraction of rows whose highest logit is the target: a metric object of one's own."""

    def reset(self) -> None:
        self.hits = self.total = 0

    def update(self, output, target) -> None:
        self.hits += int((output.argmax(-1) == target).sum())
        self.total += len(target)

    def compute(self) -> float:
        return self.hits / self.total

    def merge(self, other: Hits) -> None:
        self.hits += other.hits
        self.total += other.total


class Unmergeable(Hits):
    merge = None  # type: ignore[assignment]


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Hidden(4, 8) >> Scored(8, 3))


def data() -> tuple[list, dict[str, list]]:
    """8 training batches (the last smaller, so the ranks' last steps differ in examples);
    a validation set of 3 batches of unequal sizes and one of a single batch."""
    gen = torch.Generator().manual_seed(1)

    def batch(n):
        return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)

    train = [batch(4) for _ in range(7)] + [batch(3)]
    return train, {"all": [batch(5), batch(7), batch(3)], "one": [batch(6)]}


def trainer(out: Path | None) -> st.Trainer:
    watchers = [st.CSVLog(out / "log.csv"), st.TensorBoard(out / "tb")] if out else []
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        epochs=2,
        metrics={"hits": Hits(), "acc": st.accuracy},
        watchers=watchers,
        options=st.Options(progress=False, shuffle=False, monitor="val_all_hits", mode="max"),
    )


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train, val = data()
    result = trainer(out).fit(graph(), train, val=val)
    refused = []
    unmergeable = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        metrics={"hits": Unmergeable()},
        options=st.Options(progress=False),
    )
    for call in (
        lambda: unmergeable.fit(graph(), train, val=val["all"]),
        lambda: unmergeable.evaluate(graph(), val["all"]),
    ):
        try:
            call()
        except SettingError as e:
            refused.append(str(e))
    # a torchmetrics metric holding concatenated states (AUROC's outputs): "one" is one
    # batch, and rank 1 sees none of it — torchmetrics could not gather its empty state
    from torchmetrics.classification import MulticlassAUROC

    auroc = st.Trainer(loss=F.cross_entropy, metrics={"auc": MulticlassAUROC(num_classes=3)})
    auc_all = auroc.evaluate(graph(), val["all"])  # every rank has a batch: computed
    try:
        auroc.evaluate(graph(), val["one"])
    except SettingError as e:
        refused.append(str(e))
    dist.barrier()
    dist.destroy_process_group()
    torch.save(
        {
            "state": dict(result.state),
            "losses": result.losses,
            "metrics": result.metrics,
            "refused": refused,
            "auc_all": auc_all,
        },
        out / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main()
