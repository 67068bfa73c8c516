"""Metric functions for ``Trainer(metrics={...})``: ``fn(output, target) -> scalar``.

Each is a mean over the batch; the Trainer averages them over examples.
"""

from __future__ import annotations

import torch

__all__ = ["accuracy"]


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The fraction of rows whose highest logit is the target class.

    Example:
        >>> accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        tensor(0.5000)
    """
    return (output.argmax(dim=-1) == target).float().mean()
