"""A DDP rank's share of a DataLoader's own sampler (samplers.py), in one process: the
ranks' digests are stood in for by monkeypatching ``ddp.gather``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from somatize.errors import SettingError
from somatize.torch import batches, ddp, samplers
from somatize.torch.samplers import BatchShare, RankShare, epoch_generator


@pytest.fixture
def agreeing(monkeypatch):
    """Two ranks whose draws agree (each gathers its own digest twice)."""
    monkeypatch.setattr(samplers.ddp, "gather", lambda value: [value, value])


def test_rank_share_takes_every_world_th_of_the_seeded_draw_padded_to_equal_counts(agreeing):
    inner = SubsetRandomSampler(range(10, 15))  # 5 indices on 2 ranks: one padded
    shares = [RankShare(inner, rank, 2, seed=7) for rank in (0, 1)]
    for epoch in (0, 1):
        for s in shares:
            s.set_epoch(epoch)
        drawn = list(SubsetRandomSampler(range(10, 15), generator=epoch_generator(7, epoch)))
        got = [list(s) for s in shares]
        assert got == [drawn[0::2], drawn[1::2] + drawn[:1]]
        assert [len(s) for s in shares] == [3, 3]
    assert list(shares[0]) == list(shares[0])  # the same epoch draws the same again
    shares[0].set_epoch(0)
    assert list(shares[0]) != got[0]  # (epoch 1 drew another order)


def test_batch_share_drops_the_last_batches_that_would_leave_ranks_uneven(agreeing):
    inner = BatchSampler(RandomSampler(range(10)), batch_size=2, drop_last=False)  # 5 batches
    shares = [BatchShare(inner, rank, 2, seed=0) for rank in (0, 1)]
    got = [list(s) for s in shares]
    drawn = list(BatchSampler(RandomSampler(range(10), generator=epoch_generator(0, 0)), 2, False))
    assert got == [drawn[0:4:2], drawn[1:4:2]] and len(shares[0]) == 2  # drawn[4] dropped


def test_ranks_drawing_differently_are_refused_naming_the_sampler_and_the_fix(monkeypatch):
    monkeypatch.setattr(samplers.ddp, "gather", lambda value: [value, "another"])
    share = RankShare(WeightedRandomSampler([1.0, 2.0], 4), 0, 2, seed=0)
    with pytest.raises(
        SettingError,
        match=r"WeightedRandomSampler drew a different sequence"
        r" on each rank in epoch 0.*`generator` attribute.*DistributedSampler",
    ):
        list(share)


def test_shard_keeps_a_ranked_sampler_replaces_only_the_default_and_wraps_the_rest():
    ds = TensorDataset(torch.arange(8.0))

    def sharded(**kw):
        return ddp.shard(DataLoader(ds, **kw), 1, 2, seed=0)

    for shuffle in (False, True):  # the default samplers: a DistributedSampler, shuffled alike
        got = sharded(batch_size=2, shuffle=shuffle).sampler
        assert type(got) is DistributedSampler and got.shuffle is shuffle and got.rank == 1
    own = DistributedSampler(ds, num_replicas=2, rank=1)
    assert sharded(batch_size=2, sampler=own).sampler is own

    class Ranked(SequentialSampler):  # shards by rank itself, as DistributedSampler says it
        num_replicas, rank = 2, 1

    ranked = DataLoader(ds, batch_size=2, sampler=Ranked(ds))
    assert ddp.shard(ranked, 1, 2, seed=0) is ranked
    for own in (SubsetRandomSampler([0, 1, 2]), RandomSampler(ds, replacement=True)):
        got = sharded(batch_size=2, sampler=own)
        assert isinstance(got.sampler, RankShare) and got.sampler.inner is own
        assert got.batch_size == 2 and len(got.sampler) == -(-len(own) // 2)
    batched = sharded(batch_sampler=BatchSampler(SequentialSampler(ds), 2, False))
    assert isinstance(batched.batch_sampler, BatchShare) and len(batched) == 2

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    stream = DataLoader(Stream(), batch_size=2)
    assert ddp.shard(stream, 1, 2, seed=0) is stream  # epoch_batches shares it by rounds


def test_a_stream_is_shared_in_full_rounds_agreed_on_when_it_has_no_length(monkeypatch):
    said = []

    def total(t):  # rank 1 of 2; the other rank's stream is one round shorter
        said.append(int(t.item()))
        return t + (1 if len(said) == 2 else 0)

    monkeypatch.setattr(batches.ddp, "total", total)

    class Stream:
        def __iter__(self):
            return iter(range(7))

    assert list(batches.epoch_batches(Stream(), 0, 0, False, 1, 2)) == [1]  # 3 full rounds here
    assert said == [0, 0]  # one all-reduce a round, until a rank ran short
    said.clear()
    assert list(batches.epoch_batches(list(range(7)), 0, 0, False, 1, 2)) == [1, 3, 5]
    assert list(batches.epoch_batches(SizedStream(7), 0, 0, False, 1, 2)) == [1, 3, 5]
    assert said == []  # data with a length: the ranks know alike where the rounds end


class SizedStream:  # a re-iterable with a length, not a sequence
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n
