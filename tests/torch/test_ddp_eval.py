"""Evaluation under ``torchrun --nproc_per_node=2`` (``scripts/ddp_eval.py``): the average's
buffers, a sampler drawing from the global RNG, and a NaN on one rank."""

from __future__ import annotations

import pytest
import torch

from .test_ddp import said, torchrun


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-eval")
    assert torchrun(out, script="ddp_eval.py") == 0, said(out)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.mark.slow
def test_an_ema_of_a_batchnorm_graph_is_evaluated_with_rank_0s_buffers(ranks):
    for r in ranks:  # the fit's last evaluation is of the model it returns
        assert r["ema_val"] == pytest.approx(r["ema_evaluated"], rel=1e-6)
    assert ranks[0]["ema_val"] == ranks[1]["ema_val"]


@pytest.mark.slow
def test_a_sampler_drawing_from_the_global_rng_gives_every_row_once(ranks):
    for r in ranks:
        assert r["rows"] == 12 * 1000 + 12  # 12 distinct rows of 12 read


@pytest.mark.slow
def test_a_nan_on_one_rank_is_named_as_another_ranks_on_the_others(ranks):
    assert "the loss of another rank is NaN or inf at step 2" in ranks[0]["nonfinite"]
    assert "this rank's (rank 0" in ranks[0]["nonfinite"]
    assert "the loss is nan at step 2" in ranks[1]["nonfinite"]
