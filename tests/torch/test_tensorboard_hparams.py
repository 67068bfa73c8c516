"""The hyper-parameters of ``st.TensorBoard(hparams=)`` as TensorBoard's HParams view
shows them: flat and plain, as Lightning's ``log_hyperparams`` writes them.

Found by a usability audit (a sweep over ``np.arange`` widths, a nested config, an
``argparse`` Namespace): numpy numbers and tensors arrived as strings, which the view can
neither sort nor plot; a nested dict was one string column; a Namespace or a dataclass
failed with a bare ``TypeError`` (``object is not iterable``), and a key that is not a
string only at the fit's start, in protobuf.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Graph
from somatize.errors import SettingError
from somatize.torch.tensorboard_hparams import flat_hparams
from tests.torch.test_tensorboard import hparams_view
from tests.torch.test_watchers_torch import Body, Head, data


def sweep_fit(log_dir, hparams):
    """One short run logged under ``log_dir`` with ``hparams``, evaluated once."""
    torch.manual_seed(0)
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"acc": st.accuracy},
        watchers=[st.TensorBoard(log_dir, hparams=hparams)],
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Body() >> Head()), data(), val=data(2))


def test_numpy_numbers_and_one_element_tensors_are_numbers_in_the_view(tmp_path):
    hidden = np.arange(4, 9, 4)  # (np.int64, as a sweep over np.arange gives them)
    for i, h in enumerate(hidden):
        hp = {"lr": np.float32(0.5) * 0.2, "hidden": h, "wd": torch.tensor(0.25),
              "bn": np.bool_(i == 0), "mix": np.array([0.5])}  # fmt: skip
        sweep_fit(tmp_path / f"h{h}", hp)
    (columns, _), rows = hparams_view(tmp_path)
    assert columns == {"lr": False, "hidden": True, "wd": False, "bn": True, "mix": False}
    assert rows["h4"] == (
        {"lr": pytest.approx(0.1), "hidden": 4.0, "wd": 0.25, "bn": True, "mix": 0.5},
        True,
    )
    assert rows["h8"][0]["hidden"] == 8.0 and rows["h8"][0]["bn"] is False


def test_a_nested_config_is_one_column_per_leaf(tmp_path):
    config = {"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "model": {"hidden": 8}, "seed": 0}
    sweep_fit(tmp_path / "run", config)
    _, rows = hparams_view(tmp_path)
    assert rows["run"] == (
        {"optim/lr": 0.1, "optim/betas": "[0.9, 0.99]", "model/hidden": 8.0, "seed": 0.0},
        True,
    )


@dataclasses.dataclass
class Optim:
    lr: float = 0.1
    name: str = "sgd"


@dataclasses.dataclass
class Config:
    optim: Optim = dataclasses.field(default_factory=Optim)
    hidden: int = 8


def test_an_argparse_namespace_or_a_dataclass_is_taken_as_lightning_takes_them(tmp_path):
    args = argparse.Namespace(lr=0.1, hidden=8, act=None)
    sweep_fit(tmp_path / "args", args)
    sweep_fit(tmp_path / "cfg", Config())
    _, rows = hparams_view(tmp_path)
    assert rows["args"] == ({"lr": 0.1, "hidden": 8.0, "act": "None"}, True)
    assert rows["cfg"] == ({"optim/lr": 0.1, "optim/name": "sgd", "hidden": 8.0}, True)


def test_a_key_that_is_not_a_string_is_its_str(tmp_path):
    sweep_fit(tmp_path / "run", {1: 0.5, "lr": 0.1})
    assert hparams_view(tmp_path)[1]["run"] == ({"1": 0.5, "lr": 0.1}, True)


@pytest.mark.parametrize("hparams", [[("lr", 0.1)], "lr=0.1", 0.1])
def test_hparams_of_another_kind_are_refused_when_the_watcher_is_made(tmp_path, hparams):
    with pytest.raises(SettingError, match=r"hparams must be a dict.*hparams=vars\(args\)"):
        st.TensorBoard(tmp_path, hparams=hparams)


def test_flat_hparams_leaves_a_flat_plain_dict_as_it_is():
    plain = {"lr": 0.1, "hidden": 8, "bn": True, "act": "relu", "ratio": float("inf")}
    assert flat_hparams(plain) == plain
    assert flat_hparams(flat_hparams(plain)) == plain and flat_hparams(None) == {}
