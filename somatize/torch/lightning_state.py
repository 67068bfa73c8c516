"""What a ``LightningGraph`` keeps in a Lightning checkpoint besides the weights, under
``checkpoint["somatize"]``: its steps' losses and terms, each finished epoch's means, validation history,
example counts and cache counts (every rank's under DDP, each rank resuming its own), as
plain lists, dicts and numbers (a checkpoint loads with ``weights_only=True``); and the
checks that a checkpoint is loaded into the graph it was written for, frozen as it was.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch

from ..errors import CheckpointError, SettingError
from . import tally
from .resumed_optimizer import check_frozen

if TYPE_CHECKING:
    from .lightning import LightningGraph

__all__ = ["check_loading", "check_resumed", "restore", "saved"]


def saved(lg: LightningGraph, checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``on_save_checkpoint`` writes: the run so far. Under DDP every rank's losses,
    example counts and cache counts (``ranks``, ``cache``: one each, in rank order — each
    rank trains and counts its own share); ``losses`` and ``examples`` are the writing
    rank's, as a checkpoint from before ``ranks`` was kept holds them. The frozen and
    cached nodes are the graph's now, in ``checkpoint``'s hyper-parameters too (a callback
    may have unfrozen one since Lightning configured the optimizers)."""
    now = {"frozen": sorted(lg.graph.memory.frozen), "cached": sorted(lg.graph.memory.cached)}
    lg.hparams.update(now)
    written = (checkpoint or {}).get("hyper_parameters")
    if isinstance(written, dict):  # (dumped before on_save_checkpoint is called)
        written.update(now)
    mine = {**lg._log.state(), "examples": dict(lg._examples)}
    ranks = _every_rank(lg, {**mine, "cache": tally.state(lg._tally)})
    return {
        **mine,
        "frozen": now["frozen"],
        "history": [dict(r) for r in lg.history],
        "epoch_losses": list(lg.epoch_losses),  # (every rank's alike: lightning_steps.py)
        "epoch_terms": {k: list(v) for k, v in lg.epoch_terms.items()},
        "val_examples": dict(lg._val_examples),
        "cache": [r.pop("cache") for r in ranks],
        "ranks": ranks,
    }


def _every_rank(lg: LightningGraph, mine: dict[str, Any]) -> list[dict[str, Any]]:
    """``mine`` of every rank, in rank order (collective: Lightning asks every rank for
    the checkpoint, then rank 0 writes it)."""
    if lg.trainer.world_size > 1:
        from . import ddp

        return [dict(r) for r in ddp.gather(mine)]
    return [mine]


def restore(lg: LightningGraph, checkpoint: dict[str, Any]) -> None:
    """``on_load_checkpoint``: refuse a checkpoint of another graph; take back the run.

    Raises:
        CheckpointError: the checkpoint was written for a graph of another topology, or
            (resuming a fit) with other nodes frozen.
    """
    written = checkpoint.get("hyper_parameters", {}).get("topology")
    own = lg.graph.topology.to_json()
    if written is not None and written != own:
        raise CheckpointError(
            f"the checkpoint was written for a graph with topology {written}, "
            f"not this one ({own}); load it into the graph it was trained with"
        )
    trainer = lg._trainer
    if trainer is not None and trainer.state.fn != "fit":  # (TrainerFn)
        return  # (test, validate, predict with ckpt_path=: the weights only, not the run)
    state = checkpoint.get("somatize")
    if trainer is not None:  # a fit resumed: checked before its optimizer's state is loaded
        frozen = (state or {}).get("frozen", checkpoint.get("hyper_parameters", {}).get("frozen"))
        lg._frozen_written = {"": frozen} if isinstance(frozen, list) else None
        if trainer.strategy.restore_checkpoint_after_setup:  # (on_fit_start has run)
            check_resumed(lg)
    if state is None:
        return
    lg._restored = trainer is not None  # (a fit resumed: on_fit_start keeps what it took)
    world = lg._trainer.world_size if lg._trainer is not None else 1
    ranks = state.get("ranks")  # (None in a checkpoint from before it was kept)
    mine = ranks[lg.global_rank] if isinstance(ranks, list) and len(ranks) == world else state
    lg._log.restore(mine, state)  # (another number of ranks: the writing rank's steps)
    lg.history = [dict(r) for r in state["history"]]
    lg._examples = dict(mine["examples"])
    lg._val_examples = dict(state.get("val_examples") or {})
    since = tally.resumed(state.get("cache"), lg.global_rank, world)  # (None: an old one)
    if lg._tally is None:  # (restored before on_fit_start, as Lightning does)
        lg._cache_since = since
    else:  # (a strategy restoring after setup: the fit's tally counts on from it)
        tally.detach(lg.net, lg._tally)
        lg._tally = tally.attach(lg.net, since)


def check_resumed(lg: LightningGraph) -> None:
    """The resumed checkpoint's frozen nodes are the graph's: checked at ``on_fit_start`` —
    after the callbacks' own (a fine-tuning callback's state restored, it may unfreeze its
    node again), before Lightning loads the optimizer's state, which is of the trainable
    nodes' parameters.

    Raises:
        CheckpointError: a node frozen in one and trainable in the other.
    """
    written, lg._frozen_written = lg._frozen_written, None
    check_frozen(
        written,
        {"": sorted(lg.graph.memory.frozen)},
        "LightningGraph.load_from_checkpoint(path, g=g, loss=..., optimizer=...), "
        "fitted without ckpt_path=. A node a callback unfroze mid-fit (BaseFinetuning): "
        "unfreeze it again in that callback's on_fit_start, before this check, when it was "
        "unfrozen by the checkpoint's epoch",
    )


def check_loading(path: Any, given: dict[str, Any]) -> None:
    """``load_from_checkpoint``: refuse a call without the code a checkpoint cannot hold —
    the graph and the loss (the optimizer factory only to train on) — naming the graph's
    nodes.

    Raises:
        SettingError: ``g`` or ``loss`` not given.
    """
    missing = [name for name in ("g", "loss") if name not in given]
    if not missing:
        return
    nodes = ""
    try:  # (only to name the nodes: plain data, read as weights_only)
        hparams = torch.load(path, map_location="cpu", weights_only=True)["hyper_parameters"]
        nodes = f" with nodes {json.loads(hparams['topology'])['nodes']}"
    except Exception:  # (a file Lightning's own load then reports on)
        pass
    raise SettingError(
        f"LightningGraph.load_from_checkpoint({str(path)!r}) is missing "
        f"{', '.join(f'{m}=' for m in missing)}: a checkpoint holds the graph's weights and "
        f"topology, not its code. Build the graph as it was trained{nodes} and pass it "
        "with the loss (code too; loss=None when the graph's output is the loss), and the "
        "optimizer factory to train on: LightningGraph.load_from_checkpoint(path, g=g, "
        "loss=F.cross_entropy, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3)) — "
        "optimizer= may be left out to predict, validate or test only"
    )
