"""LightningGraph under Lightning's ``strategy="ddp"``, two ranks launched by torchrun on CPU
(gloo): a node metric only some ranks report, the cache counts and hit rates over every
rank, each rank's own losses after a resume, and validation with and without Lightning's
padding (tests/torch/scripts/lightning_ddp.py runs the fits)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

from .scripts import lightning_ddp  # the script the ranks run, imported for its data
from .test_ddp import said, torchrun


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning-ddp")
    assert torchrun(out, script="lightning_ddp.py") == 0, said(out)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.mark.slow
def test_a_node_metric_only_one_ranks_batches_report_is_logged_and_recorded_as_st_trainer(ranks):
    # (before: every rank waited for ever at the first validation's end, each in another
    # all-reduce, as rank 1 logged val_flag/outliers and rank 0 did not)
    x = lightning_ddp.X[lightning_ddp.VAL]
    shares = [x[r::2, 0] > lightning_ddp.OUTLIER for r in (0, 1)]  # one batch a rank
    assert [int(s.sum()) for s in shares] == [0, 1]
    expected = sum(float(s.sum()) * len(s) for s in shares) / len(x)  # as st.Trainer weighs
    for got in ranks:
        history = got["rare"]["history"]
        assert [r["val_flag/outliers"] for r in history] == [expected] * 3
        assert [r["val_flag/outliers"] for r in got["st"]["history"]] == [expected] * 3
        logged = got["rare"]["logged"]  # logged from the record: the history's values
        assert logged["val_flag/outliers"] == expected
        assert logged["val_loss"] == pytest.approx(history[-1]["val_loss"], rel=1e-6)
    assert ranks[0]["rare"]["history"] == ranks[1]["rare"]["history"]


@pytest.mark.slow
def test_cache_counts_and_hit_rates_are_every_ranks_and_lightning_advises_nothing(ranks):
    per_rank = [got["cache"]["epochs"] for got in ranks]  # EpochEnd.cache: each rank's own
    assert [sum(e["enc"]["hits"] + e["enc"]["misses"] for e in p) for p in per_rank] == [48, 48]
    summed = {
        k: sum(e["enc"][k] for p in per_rank for e in p) for k in ("hits", "misses")
    }  # (before: result().cache was the rank's own counts)
    assert ranks[0]["cache"]["cache"] == ranks[1]["cache"]["cache"] == {"enc": summed}
    last = [p[-1]["enc"] for p in per_rank]  # the last epoch's, every rank's lookups
    rate = sum(c["hits"] for c in last) / sum(c["hits"] + c["misses"] for c in last)
    for got in ranks:  # (before: rank 0's own rate, logged by rank 0 only)
        assert got["cache"]["logged"]["cache/enc/hit_rate"] == pytest.approx(rate, rel=1e-6)
    # (before: "It is recommended to use `self.log('cache/enc/hit_rate', ..., sync_dist=True)`")
    assert ranks[0]["advised"] == ranks[1]["advised"] == []


@pytest.mark.slow
def test_after_a_resume_each_rank_goes_on_from_its_own_losses(ranks):
    for got in ranks:  # (before: rank 1's first two epochs of losses were rank 0's)
        assert (
            len(got["part"]["losses"]) == 2 and len(got["resume"]["losses"]) == 4
        )  # a step an epoch
        assert got["resume"]["losses"] == got["full"]["losses"]
        assert got["resume"]["losses"][:2] == got["part"]["losses"]
    assert ranks[0]["full"]["losses"] != ranks[1]["full"]["losses"]


@pytest.mark.slow
def test_epoch_losses_are_over_every_ranks_steps_as_train_loss_epoch(ranks):
    r0, r1 = ranks
    for run, epochs in (("rare", 3), ("cache", 3), ("resume", 4), ("full", 4)):
        e0, e1 = r0[run]["epoch_losses"], r1[run]["epoch_losses"]
        assert e0 == e1 and len(e0) == epochs  # every rank's list alike
        for e, value in enumerate(e0):  # a step an epoch, of 16 rows on each rank
            mean = (r0[run]["losses"][e] * 16 + r1[run]["losses"][e] * 16) / 32
            assert value == pytest.approx(mean, rel=1e-12)
        assert e0[-1] == pytest.approx(r0[run]["logged"]["train_loss_epoch"], rel=1e-6)
    assert r0["resume"]["epoch_losses"] == r0["full"]["epoch_losses"]  # (2 from its checkpoint)


@pytest.mark.slow
def test_terms_are_each_ranks_steps_and_their_epoch_means_over_every_rank(ranks):
    r0, r1 = (got["terms"] for got in ranks)
    for rank, got in enumerate((r0, r1)):  # each rank's own steps, as its losses
        assert got["terms"]["rank"] == [float(rank)] * len(got["losses"]) == [float(rank)] * 2
    assert r0["terms"]["ce"] != r1["terms"]["ce"]
    assert r0["epoch_terms"] == r1["epoch_terms"]  # every rank's list alike
    assert r0["epoch_terms"]["rank"] == [0.5, 0.5]  # 16 rows a step on each rank
    for e, value in enumerate(r0["epoch_terms"]["ce"]):
        assert value == pytest.approx((r0["terms"]["ce"][e] + r1["terms"]["ce"][e]) / 2)
    assert r0["epoch_terms"]["ce"][-1] == pytest.approx(r0["logged"]["train_ce_epoch"], rel=1e-6)


@pytest.mark.slow
def test_lightnings_sampler_pads_validation_and_an_unrepeated_one_evaluates_each_row_once(ranks):
    for got in ranks:
        assert got["padded"]["val_examples"] == {"val_": 30}  # 29 rows, one read twice
        unrepeated = got["unrepeated"]
        assert unrepeated["val_examples"] == {"val_": 29}
        loss = unrepeated["history"][-1]["val_loss"]
        assert loss == pytest.approx(unrepeated["single"], rel=1e-6)
        # logged from the record (Lightning's own mean over ranks of 15 and 14 examples
        # divides by 14, the mean batch size made an integer: 1.052 for 1.016)
        assert unrepeated["logged"]["val_loss"] == pytest.approx(loss, rel=1e-6)
