"""Every rank given data of one length (``somatize/torch/rank_lengths.py``), under
``torchrun --nproc_per_node=2`` (``scripts/ddp_lengths.py``), and in one process."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st

from .test_ddp import said, torchrun


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-lengths")
    assert torchrun(out, script="ddp_lengths.py") == 0, said(out)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, said",
    [
        ("list", "rank 0: 20 batches, rank 1: 14 batches"),
        ("loader", "rank 0: 10 batches (of 320 rows), rank 1: 7 batches (of 200 rows)"),
        ("val", "val set 'held'"),
        ("evaluate", "evaluate()'s data"),
    ],
)
def test_data_of_another_length_on_a_rank_is_an_error_on_every_rank(ranks, case, said):
    for r in ranks:  # (it hung until gloo's timeout, or gave a metric of neither set)
        assert said in r[case]
        assert "Give every rank the same data" in r[case]
    assert ranks[0][case] == ranks[1][case]
    if case in ("val", "evaluate"):
        assert "rank 0: 3 batches, rank 1: 1 batch;" in ranks[0][case]


@pytest.mark.slow
def test_a_dropped_last_round_is_warned_of_on_rank_0(ranks):
    assert len(ranks[0]["dropped"]) == 1
    said = ranks[0]["dropped"][0]
    assert "each epoch drops 1 batch (another each epoch, as shuffled; " in said
    assert re.search(r"; (16|10) examples in epoch 0\)", said), said  # 20 of 16, 1 of 10
    assert ranks[1]["dropped"] == []
    assert ranks[0]["dropped_examples"] == 320  # 330 less the 10 dropped


@pytest.mark.slow
def test_the_distributed_samplers_pad_is_not_counted_as_an_example(ranks):
    for r in ranks:  # (332: the sampler repeats a row for rank 1)
        assert r["odd_examples"] == 331


@pytest.mark.slow
def test_another_seed_on_a_rank_is_an_error_on_every_rank(ranks):
    for r in ranks:  # (each rank's DistributedSampler shuffled otherwise: shares overlapped)
        assert "every rank must give the Trainer the same seed" in r["seed"]
        assert "rank 0: 0, rank 1: 1" in r["seed"]
        assert "st.Trainer(seed=0)" in r["seed"]
    assert ranks[0]["seed"] == ranks[1]["seed"]


@pytest.mark.slow
def test_evaluate_on_rank_0_alone_says_that_it_is_collective(tmp_path):
    torchrun(tmp_path, script="ddp_rank0_only.py")  # (rank 0 catches; rank 1 has left)
    said = torch.load(tmp_path / "rank0.pt", weights_only=True)["said"]
    assert "under DDP evaluate() is collective: every one of the 2 ranks must call it" in said
    assert "an `if rank == 0:` around it" in said


def test_one_process_compares_nothing_and_warns_of_nothing(recwarn):
    x, y = torch.randn(331, 4), torch.randint(0, 3, (331,))
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False),
    )
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    assert trainer.fit(nn.Linear(4, 3), loader).num_examples == 331
    assert trainer.fit(nn.Linear(4, 3), list(loader)).num_examples == 331
    assert not recwarn.list


def test_a_batch_samplers_dropped_last_round_is_warned_of():
    from torch.utils.data import BatchSampler, SequentialSampler

    from somatize.torch.rank_lengths import warn_dropped
    from somatize.torch.samplers import BatchShare

    data = TensorDataset(torch.randn(10, 4), torch.randint(0, 3, (10,)))

    def loader(batches: int) -> DataLoader:
        inner = BatchSampler(SequentialSampler(range(2 * batches)), batch_size=2, drop_last=False)
        return DataLoader(data, batch_sampler=BatchShare(inner, 0, 2, seed=0))

    with pytest.warns(UserWarning, match=r"the 5 batches your BatchSampler draws .* drops the la"):
        warn_dropped(loader(5), 2, 0, True, len)  # (it dropped 1 of 5 silently)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_dropped(loader(4), 2, 0, True, len)  # (a multiple of the world: nothing said)
