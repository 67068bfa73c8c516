"""``Options(deterministic=...)``: torch's deterministic algorithms for one ``fit``
(Lightning's ``Trainer(deterministic=...)``).

True: ``torch.use_deterministic_algorithms(True)`` — an operation with no deterministic
implementation raises instead of running — with cuDNN's deterministic kernels and no
autotuning (``cudnn.benchmark = False``), and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` where
it is unset (CUDA reads it when cuBLAS starts, so in a process that used CUDA before
``fit``, set it yourself first). ``"warn"``: the same, warning instead of raising. False:
deterministic algorithms off. None (the default): torch's settings as they are.

Unlike Lightning, which sets these for the rest of the process, ``fit`` puts them back
as they were when it returns or fails. On the CPU somatize's runs are bitwise
reproducible without it; it matters on GPUs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import SettingError

__all__ = ["check_deterministic", "deterministic"]

_CUBLAS = "CUBLAS_WORKSPACE_CONFIG"


def check_deterministic(value: Any) -> None:
    if value is not None and value is not True and value is not False and value != "warn":
        raise SettingError(
            f"Options deterministic must be True, False, 'warn' or None, not {value!r}; "
            "True makes an operation with no deterministic implementation raise, 'warn' "
            "warns instead, None leaves torch's settings as they are"
        )


@contextlib.contextmanager
def deterministic(mode: bool | str | None) -> Iterator[None]:
    """torch's deterministic settings as ``mode`` asks, put back afterwards."""
    if mode is None:
        yield
        return
    cudnn = torch.backends.cudnn
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.deterministic,
        cudnn.benchmark,
    )
    env = os.environ.get(_CUBLAS)
    if mode:
        if env is None:
            os.environ[_CUBLAS] = ":4096:8"
        torch.use_deterministic_algorithms(True, warn_only=mode == "warn")
        cudnn.deterministic, cudnn.benchmark = True, False
    else:
        torch.use_deterministic_algorithms(False)
        cudnn.deterministic = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        cudnn.deterministic, cudnn.benchmark = before[2], before[3]
        if env is None:
            os.environ.pop(_CUBLAS, None)
