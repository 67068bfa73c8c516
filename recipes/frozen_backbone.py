"""A sweep of heads over a frozen backbone, with the backbone remembered per example.

    python recipes/frozen_backbone.py                 # 8 head configurations, with and without
    python recipes/frozen_backbone.py --configs 4 --epochs 3 --cache runs/backbone-cache

scikit-learn's bundled digits (8×8 images, no download). A small CNN backbone is trained
briefly on all ten classes — the "pretrained" model — then frozen; a sweep fits a fresh
linear head per configuration (learning rate, weight decay) under a shuffled
``DataLoader``. With ``g.cache("enc", per="example")`` and one ``DiskKeeper`` shared by
the sweep, the backbone runs once per example for the whole sweep; without it, once per
example per epoch per configuration. The recipe runs the sweep both ways, prints each
configuration's validation accuracy and the two times, then fine-tunes the best
configuration whole — the backbone unfrozen and uncached, at a tenth of the head's rate —
for ``--finetune-epochs`` (4; 0 skips it). It exits with status 1 if the two sweeps
disagree, the best head is below ``--target`` (0.9), the backbone computed an example more
than once (a ``--cache`` an earlier run filled computes fewer, or none), or fine-tuning
lost accuracy.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __package__ in (None, ""):  # run as a script: make the sibling recipes importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import somatize.torch as st
from recipes import digits
from somatize import DiskKeeper, Done, Graph, Node, Opaque
from somatize.watchers import CacheRows, Event


class Backbone(Node):
    """Two convolutions over the 8×8 image, pooled to 256 features."""

    def __init__(self, width: int = 32) -> None:
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),  # (batch, 8 * width)
        )

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


class Head(Node):
    def __init__(self, inputs: int, classes: int = 10) -> None:
        self.out = nn.Linear(inputs, classes)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


class Computed:
    """Counts the rows the backbone computed (training and validation). A count, not a
    ``Recorder``: a Recorder keeps every event, and each ``CacheRows`` holds its batch's
    keys, about 120 bytes a row an epoch, which grows with every epoch of a long fit."""

    def __init__(self) -> None:
        self.rows = 0

    def on_event(self, event: Event) -> None:
        if type(event) is CacheRows:
            self.rows += event.misses


def accuracy(out, y):
    return (out.argmax(-1) == y).float().mean()


def pretrained(data: digits.Batches, epochs: int) -> dict[str, torch.Tensor]:
    """The backbone's weights after a short training on every class (our "pretrained")."""
    torch.manual_seed(0)
    g = Graph.somatize(Backbone().with_id("enc") >> Head(256))
    st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=3e-3),
        epochs=epochs,
        options=st.Options(progress=False),
    ).fit(g, data)
    return {k: v for k, v in st.state(g).items() if k.startswith("enc.")}


def sweep(
    backbone: dict[str, torch.Tensor],
    train: TensorDataset,
    val: digits.Batches,
    configs: list[tuple[float, float]],
    epochs: int,
    cache: str | None,
) -> tuple[list[float], int, Graph]:
    """Fit one head per (lr, weight decay); returns their val accuracies, the rows computed
    and the best configuration's graph."""
    loader = DataLoader(train, batch_size=64, shuffle=True)
    accs, computed, best = [], 0, None
    for i, (lr, wd) in enumerate(configs):
        counted = Computed()
        torch.manual_seed(i)
        keeper = DiskKeeper(cache) if cache else None
        g = Graph.somatize(
            Backbone().with_id("enc") >> Head(256), keeper=keeper, watchers=[counted]
        )
        st.load_state(g, {**st.state(g), **backbone})
        g.freeze("enc")
        if cache:
            g.cache("enc", per="example")
        result = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps, lr=lr, wd=wd: torch.optim.AdamW(ps, lr=lr, weight_decay=wd),
            epochs=epochs,
            metrics={"acc": accuracy},
            seed=i,
            options=st.Options(progress=False),
        ).fit(g, loader, val=val)
        accs.append(result.metrics[-1]["val_acc"])
        computed += counted.rows
        if accs[-1] == max(accs):
            best = g
    assert best is not None
    return accs, computed, best


def finetune(g: Graph, train: TensorDataset, val: digits.Batches, lr: float, epochs: int) -> float:
    """Train the whole model after the probe: the backbone unfrozen and no longer cached (its
    weights change at every step, so nothing it computes repeats), at a tenth of the head's
    learning rate (Lightning's BackboneFinetuning, as a second fit); the val accuracy."""
    g.freeze("enc", False).cache("enc", False)
    model = st.module(g)

    def backbone_slower(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        enc = [p for n, p in model.named_parameters() if n.startswith("enc.")]
        head = [p for n, p in model.named_parameters() if not n.startswith("enc.")]
        return torch.optim.AdamW([{"params": enc, "lr": lr / 10}, {"params": head, "lr": lr}])

    result = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=backbone_slower,
        epochs=epochs,
        metrics={"acc": accuracy},
        options=st.Options(progress=False),
    ).fit(g, DataLoader(train, batch_size=64, shuffle=True), val=val)
    return result.metrics[-1]["val_acc"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--pretrain-epochs", type=int, default=4)
    parser.add_argument("--finetune-epochs", type=int, default=4, help="0: no fine-tuning")
    parser.add_argument("--cache", default=None, help="the DiskKeeper directory (default: temp)")
    parser.add_argument("--target", type=float, default=0.9, help="the best head's val_acc")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    train_batches, val = digits.load_data(seed=0)
    x = torch.cat([b[0] for b in train_batches])
    y = torch.cat([b[1] for b in train_batches])
    backbone = pretrained(train_batches, args.pretrain_epochs)
    grid = [(lr, wd) for lr in (3e-2, 1e-2, 3e-3, 1e-3) for wd in (0.0, 1e-2)]
    configs = grid[: args.configs]
    cache = args.cache or tempfile.mkdtemp(prefix="somatize-backbone-")

    start = time.perf_counter()
    plain, _, _ = sweep(backbone, TensorDataset(x, y), val, configs, args.epochs, None)
    t_plain = time.perf_counter() - start
    start = time.perf_counter()
    cached, computed, best = sweep(backbone, TensorDataset(x, y), val, configs, args.epochs, cache)
    t_cached = time.perf_counter() - start
    if not args.cache:
        shutil.rmtree(cache, ignore_errors=True)

    print(f"{'lr':>8} {'wd':>6} {'val_acc':>8} {'cached':>8}")
    for (lr, wd), a, b in zip(configs, plain, cached):
        print(f"{lr:>8g} {wd:>6g} {a:>8.4f} {b:>8.4f}")
    print(
        f"\n{len(configs)} heads × {args.epochs} epochs over {len(x)} examples: "
        f"{t_plain:.2f} s recomputing the backbone, {t_cached:.2f} s with it cached per "
        f"example ({t_plain / t_cached:.1f}× faster; the backbone ran on {computed} rows "
        f"of training and validation data, against {len(x) * args.epochs * len(configs)} "
        "training rows alone without the cache)"
    )
    tuned = max(cached)
    if args.finetune_epochs:
        lr = configs[cached.index(max(cached))][0] / 10  # (a tenth of the probe's)
        tuned = finetune(best, TensorDataset(x, y), val, lr, args.finetune_epochs)
        print(f"fine-tuned the best whole for {args.finetune_epochs} epochs: val_acc "
              f"{max(cached):.4f} -> {tuned:.4f}")  # fmt: skip
    agree = all(abs(a - b) <= 0.02 for a, b in zip(plain, cached))
    examples = len(x) + sum(len(b[1]) for b in val)  # the validation rows are remembered too
    # each example computed at most once (a --cache an earlier run filled: fewer, or none)
    once = computed <= examples if args.cache else computed == examples
    kept = tuned >= max(cached) - 0.02  # fine-tuning at a low rate loses nothing
    return 0 if agree and max(cached) >= args.target and once and kept else 1


if __name__ == "__main__":
    sys.exit(main())
