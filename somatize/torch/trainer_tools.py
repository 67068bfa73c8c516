"""What a Trainer does besides ``fit``: plan its steps, find a learning rate, evaluate and
predict — each with the Trainer's settings (a base class of ``Trainer``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import torch  # noqa: F401  (the docstring examples use it)
from torch import nn

from ..graph import Graph
from . import ddp, inference
from .horizon import optimizer_steps
from .lr_find import LRFind, lr_find
from .ported import ported

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["TrainerTools"]


class TrainerTools:
    """``Trainer.planned_steps``, ``lr_find``, ``evaluate`` and ``predict``."""

    seed: int

    def planned_steps(self, train: Iterable[Any]) -> int | None:
        """The optimizer steps ``fit(model, train)`` plans (Lightning's
        ``trainer.estimated_stepping_batches``): the batches of an epoch — this rank's
        share under ``torchrun``, at most ``Options(limit_train_batches=)`` — in groups of
        ``Options(accumulate=)``, times ``epochs``, at most ``max_steps``. What to size a
        scheduler by, as the Trainer steps it once per optimizer step. None when neither
        the data's length nor ``max_steps`` says (a generator).

        Example:
            >>> import somatize.torch as st
            >>> batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(20)]
            >>> trainer = st.Trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            ...                      epochs=3, options=st.Options(accumulate=2))
            >>> trainer.planned_steps(batches)  # 20 batches an epoch, in groups of 2
            30
        """
        rank, world = ddp.planned()
        return optimizer_steps(
            self._trainer(), ddp.shard(train, rank, world, self.seed), rank, world
        )

    def lr_find(
        self,
        model: Graph | nn.Module,
        train: Iterable[Any],
        *,
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        steps: int = 100,
        mode: Literal["exponential", "linear"] = "exponential",
        stop_at: float | None = 4.0,
    ) -> LRFind:
        """A learning-rate range test (Lightning's ``Tuner(trainer).lr_find``): up to
        ``steps`` steps of this Trainer's training, the rate growing from ``min_lr`` to
        ``max_lr``, stopped once the smoothed loss passes ``stop_at`` times its best. The
        model and the RNG states are then put back as they were. ``result.suggestion`` is
        the rate of the loss's steepest descent (see ``lr_find.py``).

        Example:
            >>> found = trainer.lr_find(g, train)  # doctest: +SKIP
            >>> trainer = st.Trainer(optimizer=lambda ps: SGD(ps, lr=found.suggestion), ...)  # doctest: +SKIP
        """
        return lr_find(
            self._trainer(),
            model,
            train,
            min_lr=min_lr,
            max_lr=max_lr,
            steps=steps,
            mode=mode,
            stop_at=stop_at,
        )

    # -- evaluation ---------------------------------------------------------------------

    @ported("evaluate")
    def evaluate(self, model: Graph | nn.Module, data: Iterable[Any]) -> dict[str, float]:
        """The loss and metrics of ``model`` on ``data``, averaged over examples (under
        ``Options(smoke=N)``, of its first N batches), computed on ``Options(device)`` as
        ``fit`` would (the module is moved there).

        Example:
            >>> trainer.evaluate(g, val)  # doctest: +SKIP
            {'loss': 0.31, 'acc': 0.92}
        """
        return inference.evaluate(self._trainer(), model, data)

    @ported("predict")
    def predict(self, model: Graph | nn.Module, data: Iterable[Any]) -> list[Any]:
        """The model's output for each batch of ``data``, in order, in eval mode, without grad.

        A batch ``(x, y)`` (or ``{"x": ..., "y": ...}``) is predicted from ``x``, a one-item
        batch ``[x]`` (``DataLoader(TensorDataset(x))``) from ``x``; any other batch is the
        input, moved to ``Options(device)`` (where ``fit`` would run; the
        module is moved there too). The module's mode is restored afterwards. Under
        ``Options(smoke=N)``, only the first N batches.

        Example:
            >>> logits = torch.cat(trainer.predict(g, batches))  # doctest: +SKIP
        """
        return inference.predict(self._trainer(), model, data)

    def _evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return inference.evaluated(
            self._trainer(), *args, **kwargs
        )  # one evaluation (inference.py)

    def _trainer(self) -> Trainer:
        return self  # type: ignore[return-value]  # (only a Trainer is one)
