"""``accuracy``, the stock metric: ``Trainer(metrics={"acc": st.accuracy})``."""

from __future__ import annotations

import torch

__all__ = ["accuracy"]


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The fraction of rows whose highest logit is the target class.

    Every row counts: for targets with padding (``ignore_index=-100`` in the loss), use
    ``torchmetrics.classification.MulticlassAccuracy(num_classes, ignore_index=-100,
    average="micro")`` as a metric, computed over the whole set.

    Example:
        >>> accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        tensor(0.5000)
    """
    predicted = output.argmax(dim=-1)
    if output.ndim > 1 and output.shape[-1] == 1:  # (argmax of one logit: class 0 every row)
        raise ValueError(
            f"accuracy: the output {tuple(output.shape)} has one logit per row, whose argmax "
            "is class 0 for every row; accuracy takes logits (batch, classes) — for one "
            "logit per row (a binary head), measure "
            "((output.squeeze(-1) > 0) == target).float().mean()"
        )
    if predicted.shape != target.shape:  # (broadcasting would compare every row with every row)
        raise ValueError(
            f"accuracy: the output {tuple(output.shape)} gives one predicted class per row, "
            f"{tuple(predicted.shape)} (argmax over its last dimension), but the target is "
            f"{tuple(target.shape)}; give logits (batch, classes) and class ids (batch,) — "
            "for one logit per row, measure ((output > 0) == target).float().mean()"
        )
    return (predicted == target).float().mean()
