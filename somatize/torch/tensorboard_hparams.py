"""A run's hyper-parameters for TensorBoard's HParams view: made flat and plain.

The view compares runs column by column, and sorts and plots a column only when it holds
numbers. So, as Lightning's ``TensorBoardLogger.log_hyperparams`` does: a config nested in
dicts, dataclasses or ``argparse.Namespace`` objects becomes one column per leaf
(``{"optim": {"lr": 1e-3}}`` -> ``optim/lr``); numpy scalars (``np.arange(64, 257, 64)``'s
``np.int64``, ``np.float32``) and one-element tensors become the numbers they hold; other
values (a list, None, a class) their ``str``. Before, a numpy width or a nested config
arrived as a string: a column tensorboard could neither sort nor plot.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from time import time
from typing import Any

import torch

from ..errors import SettingError

__all__ = ["flat_hparams", "session"]


def flat_hparams(hparams: Any) -> dict[str, bool | int | float | str]:
    """``hparams`` (a dict, an ``argparse.Namespace`` or a dataclass instance, nested or
    not; None for none) as one level of ``name -> bool, number or string``.

    Raises:
        SettingError: ``hparams`` is none of those (a list of pairs, a string...).
    """
    if hparams is None:
        return {}
    fields = _fields(hparams)
    if fields is None:
        raise SettingError(
            f"TensorBoard hparams must be a dict of hyper-parameters (or an argparse "
            f"Namespace, or a dataclass instance), not {type(hparams).__name__} "
            f"{_short(hparams)}; e.g. st.TensorBoard(dir, hparams={{'lr': 1e-3, 'hidden': "
            "128}) or hparams=vars(args)"
        )
    out: dict[str, bool | int | float | str] = {}
    _into(out, "", fields)
    return out


def _fields(value: Any) -> Mapping[Any, Any] | None:
    """The named parts of a dict, a Namespace or a dataclass instance; None for another value."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, argparse.Namespace):
        return vars(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return None


def _into(out: dict[str, Any], prefix: str, fields: Mapping[Any, Any]) -> None:
    for key, value in fields.items():
        name = f"{prefix}{key}"
        inner = _fields(value)
        if inner is not None:
            _into(out, f"{name}/", inner)  # (Lightning's separator: optim/lr)
        else:
            out[name] = _plain(value)


def _plain(value: Any) -> bool | int | float | str:
    """A bool, a number or a string: what the HParams view can show."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    elif type(value).__module__ == "numpy" and getattr(value, "size", 0) == 1:
        value = value.item()  # np.int64, np.float32, np.bool_, a one-element array
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def session(hparams: Mapping[str, Any] | None) -> Any:
    """The HParams plugin's summary of a run's start with its ``hparams`` (flat, as
    ``flat_hparams`` gives them), or (None) of its successful end. No experiment summary:
    tensorboard takes the one it finds first as the columns of every run, so a sweep whose
    runs differ in their keys lost columns, and each column read "differs: false"; without
    one it gathers them from all runs' starts."""
    from tensorboard.compat.proto.summary_pb2 import Summary  # type: ignore[import-untyped]
    from tensorboard.plugins.hparams import (  # type: ignore[import-untyped]
        api_pb2,
        metadata,
        plugin_data_pb2,
    )

    if hparams is None:
        end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time())
        tag, data = (
            metadata.SESSION_END_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_end_info=end),
        )
    else:
        start = plugin_data_pb2.SessionStartInfo(start_time_secs=time())
        for name, value in hparams.items():
            if isinstance(value, bool):  # (before int: True is an int)
                start.hparams[name].bool_value = value
            elif isinstance(value, (int, float)):
                start.hparams[name].number_value = value
            else:
                start.hparams[name].string_value = value if isinstance(value, str) else str(value)
        tag, data = (
            metadata.SESSION_START_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_start_info=start),
        )
    value = Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR
    )
    return Summary(value=[value])
