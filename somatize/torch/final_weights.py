"""The weights a fit ends with, checked once: non-finite values that no loss showed.

``Options(nonfinite="raise")`` (and ``"skip"``) read each step's loss. A NaN made only in
the backward pass — ``torch.where(s > 0, s.sqrt(), 0)`` at ``s < 0``: its forward is
finite, its gradient NaN — reaches the weights through the optimizer while the loss, masked
the same way, stays finite; the fit would end, and return the NaN weights, without a word.
``warn_nonfinite`` looks at the result's copy of the weights (on the CPU already), one
check per tensor, and names those holding NaN or infinity.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..stack import outside

__all__ = ["warn_nonfinite"]


def warn_nonfinite(state: Mapping[str, Any], nonfinite: str) -> None:
    """Warn when the final weights ``state`` (a ``state_copy``) hold NaN or infinity,
    unless ``Options(nonfinite="ignore")`` asked for no such checks."""
    if nonfinite == "ignore":
        return
    bad = [
        k
        for k, t in state.items()
        if isinstance(t, torch.Tensor)
        and (t.is_floating_point() or t.is_complex())
        and not bool(torch.isfinite(t).all())
    ]
    if not bad:
        return
    shown = ", ".join(map(repr, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    warnings.warn(
        f"the fit ended with non-finite weights in {shown}, though every step's loss was "
        "finite: a NaN or infinity made in the backward pass alone (a gradient through "
        "torch.where, sqrt or log at a point its forward masks) reached them through the "
        "optimizer. Find the operation with torch.autograd.detect_anomaly() around the fit, "
        "or clip the gradients, Options(clip_grad_norm=...): a non-finite gradient norm "
        "is then caught as a non-finite loss is. result.state holds these weights as they are",
        RuntimeWarning,
        stacklevel=outside(),
    )
