"""``Options(ema=decay)``: an exponential moving average of the trained weights.

After every optimizer step the average moves toward the weights, by torch's own EMA
update (``torch.optim.swa_utils.get_ema_multi_avg_fn``, the one ``AveragedModel`` and
Lightning's ``EMAWeightAveraging`` use); the first step's weights start it. What is
averaged: the trainable parameters and every floating-point buffer (BatchNorm's running
statistics, as ``AveragedModel(use_buffers=True)`` does); integer buffers
(``num_batches_tracked``) and frozen parameters are the model's own.

As with Lightning's ``WeightAveraging``, evaluation during the fit runs on the averaged
weights (so ``val_*`` metrics, ``best``, checkpoint ranking and pruning judge them), and
the model holds them when ``fit`` returns (``TrainResult.state``). Checkpoints hold the
trained weights under ``"model"`` (what a resume continues from) and the average under
``"ema"``, so a resumed run is bitwise the uninterrupted one.

The update is an optimizer step post-hook, so a step the GradScaler or the non-finite
check skips moves nothing, and one accumulation window is one update.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

from ..errors import CheckpointError, SettingError
from ..stack import outside

__all__ = ["Average", "averaged", "check_decay", "restore_average", "swapped"]


def check_decay(decay: Any) -> None:
    """``Options(ema=)``: a decay in (0, 1), or None (no average)."""
    if decay is None:
        return
    if isinstance(decay, bool) or not isinstance(decay, (int, float)):
        raise SettingError(
            f"Options(ema={decay!r}) must be a decay in (0, 1) such as 0.999, or None"
        )
    if not (0.0 < decay < 1.0) or math.isnan(decay):
        raise SettingError(
            f"Options(ema={decay!r}) is out of range: the decay must lie strictly between 0 "
            "and 1 (0.999 averages over about the last 1,000 steps)"
        )


class Average:
    """The average of ``net``'s trainable parameters and floating buffers (module docstring)."""

    def __init__(self, net: nn.Module, decay: float) -> None:
        self.decay = float(decay)
        named: list[tuple[str, torch.Tensor]] = [
            (n, p) for n, p in net.named_parameters() if p.requires_grad
        ]
        named += [(n, b) for n, b in net.named_buffers() if b.is_floating_point()]
        self.names = [n for n, _ in named]
        self.live = [t for _, t in named]
        self.average = [t.detach().clone() for t in self.live]
        self.updates = 0  # steps averaged (AveragedModel's n_averaged)
        self._ema = get_ema_multi_avg_fn(self.decay)
        self._hook: Any = None

    def attach(self, opt: torch.optim.Optimizer) -> None:
        """Update after every step ``opt`` takes (until ``detach``)."""
        self._hook = opt.register_step_post_hook(lambda *_: self.update())

    def detach(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    @torch.no_grad()
    def update(self) -> None:
        """Move the average toward the weights (the first update copies them)."""
        live = [t.detach() for t in self.live]
        if self.updates == 0:
            torch._foreach_copy_(self.average, live)
        else:
            groups: dict[tuple[Any, Any], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
            for a, t in zip(self.average, live):
                pair = groups.setdefault((a.device, a.dtype), ([], []))
                pair[0].append(a)
                pair[1].append(t)
            for averages, weights in groups.values():
                self._ema(averages, weights, None)
        self.updates += 1

    @torch.no_grad()
    def exchange(self) -> None:
        """Swap the weights and the average (twice: as before)."""
        held = [t.detach().clone() for t in self.live]
        torch._foreach_copy_([t.detach() for t in self.live], self.average)
        torch._foreach_copy_(self.average, held)

    def state(self) -> dict[str, Any]:
        """For a checkpoint: tensors, numbers and strings only (``weights_only`` loads it)."""
        return {
            "decay": self.decay,
            "updates": self.updates,
            "state": {n: a.detach().to("cpu", copy=True) for n, a in zip(self.names, self.average)},
        }


def averaged(net: nn.Module, opt: torch.optim.Optimizer, decay: float | None) -> Average | None:
    """The run's average, updated after each of ``opt``'s steps (None: no ``Options(ema=)``)."""
    if decay is None:
        return None
    average = Average(net, decay)
    average.attach(opt)
    return average


@contextlib.contextmanager
def swapped(average: Average | None) -> Iterator[None]:
    """The model holds the average inside (nothing averaged yet, or no average: unchanged)."""
    if average is None or average.updates == 0:
        yield
        return
    average.exchange()
    try:
        yield
    finally:
        average.exchange()


def restore_average(payload: dict[str, Any], average: Average | None, path: Any) -> None:
    """Load a checkpoint's ``"ema"`` into ``average``. Warns where they differ: a checkpoint
    without one (the average starts afresh at the resumed weights), a run without one (it
    goes on from the raw weights, and returns them), another decay (the new one goes on)."""
    import warnings

    saved = payload.get("ema")
    if average is None:
        if isinstance(saved, dict) and saved.get("state") is not None:
            decay = saved.get("decay")
            warnings.warn(
                f"{path} holds a weight average (written with Options(ema={decay})), and this "
                "run has no Options(ema=): it goes on from the raw weights and its result is "
                f"those, not the average; resume with Options(ema={decay}) to keep it",
                stacklevel=outside(),
            )
        return
    if saved is None:
        warnings.warn(
            f"{path} holds no weight average (written without Options(ema=)): the average "
            "starts afresh from the resumed weights",
            stacklevel=outside(),
        )
        return
    then = saved.get("decay") if isinstance(saved, dict) else None
    if isinstance(then, float) and then != average.decay:
        warnings.warn(
            f"{path}'s weight average was kept with Options(ema={then}), and this run's is "
            f"Options(ema={average.decay}): the average goes on from the checkpoint's with the "
            "new decay (not as the run that wrote it would have)",
            stacklevel=outside(),
        )
    state = saved.get("state") if isinstance(saved, dict) else None
    if not isinstance(state, dict) or not isinstance(saved.get("updates"), int):
        raise CheckpointError(f"{path}: its 'ema' entry is not a weight average the Trainer wrote")
    missing = [n for n in average.names if n not in state]
    extra = [n for n in state if n not in set(average.names)]
    if missing or extra:
        raise CheckpointError(
            f"{path}: its weight average does not fit this model (missing {missing[:3]}, "
            f"unexpected {extra[:3]}); resume with the model and freezing that wrote it"
        )
    with torch.no_grad():
        for n, a in zip(average.names, average.average):
            t = state[n]
            if not isinstance(t, torch.Tensor) or t.shape != a.shape:
                raise CheckpointError(
                    f"{path}: the weight average of {n!r} has shape "
                    f"{tuple(getattr(t, 'shape', ()))}, the model's {tuple(a.shape)}; "
                    "resume with the model that wrote it"
                )
            a.copy_(t)
    average.updates = saved["updates"]
