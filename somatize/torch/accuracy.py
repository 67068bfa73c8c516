"""``accuracy``, the stock metric: ``Trainer(metrics={"acc": st.accuracy})``."""

from __future__ import annotations

import torch

__all__ = ["accuracy"]


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The fraction of rows whose highest logit is the target class, in float64 (float32 on
    MPS, which has no float64).

    In float64 a batch's fraction times its rows is its count of hits within far less than
    half a unit, so evaluation's example-weighted mean over batches of different sizes is
    the set's hits over its rows, and two evaluations with as many hits tie exactly (in
    float32 the last batch's rounding would rank one of them ahead: ``Checkpointing(best=)``
    and ``Patience`` would see an improvement where there is none).

    Every row counts: for targets with padding (``ignore_index=-100`` in the loss), use
    ``torchmetrics.classification.MulticlassAccuracy(num_classes, ignore_index=-100,
    average="micro")`` as a metric, computed over the whole set.

    Example:
        >>> accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        tensor(0.5000, dtype=torch.float64)
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
    hits = predicted == target
    return hits.to(torch.float32 if hits.device.type == "mps" else torch.float64).mean()
