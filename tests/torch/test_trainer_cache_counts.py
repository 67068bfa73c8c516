"""What a graph's remembered nodes found during a fit: TrainResult.cache, EpochEnd.cache, the
warning when an epoch finds nothing, and the TensorBoard and progress lines showing it."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque, Recorder
from somatize.torch.tally import CacheTally, _node
from somatize.watchers import CacheHit, CacheMiss, CacheRows, EpochEnd

N = 192  # examples: three batches of 64


class Backbone(Node):
    def __init__(self) -> None:
        self.net = nn.Linear(8, 16)

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


class Noisy(Dataset):
    """Each example with fresh noise every time it is read: random augmentation's effect."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.randn(self.x.shape[1]), self.y[i]


def examples():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(N, 8, generator=gen), torch.randint(0, 3, (N,), generator=gen)


def graph(per="example", keeper=None):
    torch.manual_seed(0)
    g = Graph.somatize(Backbone().with_id("enc") >> Head(), keeper=keeper)
    g.freeze("enc")
    return g.cache("enc", per=per) if per else g


def fit(g, data, epochs=3, watchers=(), val=None):
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        watchers=list(watchers),
        options=st.Options(progress=False),
    )
    return trainer.fit(g, data, val=val)


def loader(dataset=None):
    return DataLoader(dataset or TensorDataset(*examples()), batch_size=64, shuffle=True)


def test_a_fit_counts_each_epoch_and_the_whole_run_of_training_lookups():
    rec = Recorder()
    val = [(torch.randn(32, 8), torch.randint(0, 3, (32,)))]  # new rows: misses, if counted
    g = graph()
    result = fit(g, loader(), watchers=[rec], val=val)
    per_epoch = [e.cache for e in rec.of(EpochEnd)]
    assert per_epoch == [
        {"enc": {"hits": 0, "misses": N}},
        {"enc": {"hits": N, "misses": 0}},
        {"enc": {"hits": N, "misses": 0}},
    ]  # the evaluations (32 rows each epoch) are not counted
    assert result.cache == {"enc": {"hits": 2 * N, "misses": N}}
    assert result.summary()["cache"] == result.cache
    assert g.watchers == []  # the tally was the fit's own


def test_nothing_is_counted_or_attached_when_the_graph_remembers_nothing():
    g = graph(per=None)
    rec = Recorder()
    result = fit(g, loader(), epochs=2, watchers=[rec])
    assert result.cache == {} and all(e.cache == {} for e in rec.of(EpochEnd))
    assert g.watchers == []


def test_the_tally_leaves_the_graph_when_training_fails():
    g = graph()
    own = Recorder()
    g.watchers.append(own)

    def broken(out, y):
        raise RuntimeError("loss failed")

    trainer = st.Trainer(
        loss=broken, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), epochs=1,
        options=st.Options(progress=False),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="loss failed"):
        trainer.fit(g, loader())
    assert g.watchers == [own]  # the user's watcher stays, the tally is gone


def test_an_epoch_that_finds_nothing_stored_warns_once_naming_the_node_and_causes():
    x, y = examples()
    with pytest.warns(RuntimeWarning) as caught:
        result = fit(graph(), loader(Noisy(x, y)), epochs=3)
    cold = [w for w in caught if "none of its" in str(w.message)]
    assert len(cold) == 1  # epochs 2 and 3 both found nothing: said once
    message = str(cold[0].message)
    assert "node 'enc'" in message and "epoch 2" in message and f"{N:,} lookups" in message
    assert "random augmentation" in message and "g.explain(batch)" in message
    assert "per='example'" not in message  # it is cached per example already
    assert "evicted" not in message  # (the default keeper held every row)
    assert cold[0].filename == __file__  # pointed at the fit call, not inside the Trainer
    assert result.cache == {"enc": {"hits": 0, "misses": 3 * N}}


def test_a_cold_epoch_names_padding_to_each_batchs_longest_as_a_cause():
    x, y = examples()

    def padded(items):  # each batch padded to its own longest: rows change with the batch
        longest = 1 + int(torch.randint(0, 64, ()))
        xs = torch.stack([torch.nn.functional.pad(a, (0, longest)) for a, _ in items])
        return xs, torch.stack([b for _, b in items])

    class Wide(Node):
        def __init__(self) -> None:
            self.net = nn.Linear(1, 16)

        def forward(self, x, ctx):
            return Done(Opaque(self.net(x.unsqueeze(-1)).mean(1)))

    torch.manual_seed(0)
    g = Graph.somatize(Wide().with_id("enc") >> Head())
    g.freeze("enc").cache("enc", per="example")
    data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, collate_fn=padded)
    with pytest.warns(RuntimeWarning, match="node 'enc' is cached") as caught:
        fit(g, data, epochs=2)
    message = next(str(w.message) for w in caught if "node 'enc' is cached" in str(w.message))
    assert "padded to its own longest" in message and "fixed length" in message
    assert "Its input came in rows of " in message and " shapes this epoch, (" in message


def test_a_node_cached_per_batch_under_a_shuffled_loader_is_told_to_cache_per_example():
    with pytest.warns(
        RuntimeWarning, match=r"cache it per example, g.cache\('enc', per='example'\)"
    ) as caught:
        result = fit(graph(per=None).cache("enc"), loader(), epochs=2)
    # (raw text or lists have no rows: the node mapped over its items instead)
    assert any(
        "a node of raw text or of lists: map it over each item, .mapped()" in str(w.message)
        for w in caught
    )
    assert result.cache == {"enc": {"hits": 0, "misses": 6}}  # three batches an epoch: calls


def test_a_keeper_too_small_for_an_epoch_shows_as_a_cold_epoch():
    with pytest.warns(RuntimeWarning, match="the keeper dropped the entries") as caught:
        result = fit(graph(keeper=MemoryKeeper(max_bytes=4096)), loader(), epochs=2)
    hits = result.cache["enc"]["hits"]
    assert hits < N // 10  # (a few rows of the last batch may survive: still cold)
    found = f"only {hits} of its" if hits else "none of its"
    assert f"{found} {N} lookups of epoch 2" in str(caught[0].message)
    assert "somatize cache gc" in str(caught[0].message)  # a gc elsewhere drops them too
    # the known cause first (before: one of five possible causes in the list)
    assert str(caught[0].message).startswith("The keeper evicted ")
    assert "MemoryKeeper(max_bytes=4,096) holds less than an epoch stores" in str(caught[0].message)


def test_a_bounded_disk_keeper_too_small_for_an_epoch_names_its_evictions(tmp_path):
    from somatize import DiskKeeper

    keeper = DiskKeeper(tmp_path / "cache", max_bytes=8192)
    with pytest.warns(RuntimeWarning, match="the keeper dropped the entries") as caught:
        result = fit(graph(keeper=keeper), loader(), epochs=2)
    assert result.cache["enc"]["hits"] < N // 10
    message = str(caught[0].message)
    evicted = keeper.stats().evicted
    assert evicted > 0 and message.startswith(f"The keeper evicted {evicted:,} entries since")
    assert f"DiskKeeper('{tmp_path / 'cache'}', max_bytes=8,192) holds less than an " in message
    assert "raise max_bytes (or leave it out, and run somatize cache gc" in message


def test_warm_epochs_and_a_first_epoch_alone_do_not_warn():
    g = graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fit(g, loader(), epochs=1)  # one epoch: nothing could have been found
        fit(g, loader(), epochs=2)  # a second fit on a warm keeper: every row found


def test_items_of_a_mapped_node_count_as_the_node_and_pausing_stops_counting():
    assert _node("enc[12]") == "enc" and _node("sub/enc[0]") == "sub/enc"
    assert _node("enc") == "enc" and _node("odd[x]") == "odd[x]" and _node("[3]") == "[3]"
    tally = CacheTally()
    tally.on_event(CacheHit("r", "words[0]", "k"))
    tally.on_event(CacheMiss("r", "words[1]", "k"))
    tally.on_event(CacheRows("r", "enc", 0, 5, 3))
    with tally.paused():
        tally.on_event(CacheRows("r", "enc", 0, 100, 100))
    assert tally.end_epoch(0) == {
        "words": {"hits": 1, "misses": 1},
        "enc": {"hits": 5, "misses": 3},
    }
    tally.on_event(CacheRows("r", "enc", 1, 0, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert tally.end_epoch(1, warn=False) == {"enc": {"hits": 0, "misses": 8}}  # rank > 0
    assert tally.total == {"words": {"hits": 1, "misses": 1}, "enc": {"hits": 5, "misses": 11}}


def test_tensorboard_and_the_progress_line_show_each_epochs_hit_rate(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stream = io.StringIO()
    fit(graph(), loader(), epochs=2, watchers=[st.TensorBoard(tmp_path), st.Progress(stream)])
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("cache/enc/hit_rate")] == [(3, 0.0), (6, 1.0)]
    lines = stream.getvalue()
    assert f"epoch 1 · cache hits: enc 0% of {N}" in lines
    assert f"epoch 2 · cache hits: enc 100% of {N}" in lines


def test_the_csv_log_has_a_row_per_epoch_with_what_the_cache_found(tmp_path):
    import csv

    path = tmp_path / "log.csv"
    fit(graph(), loader(), epochs=2, watchers=[st.CSVLog(path)])
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert [(r["epoch"], r["cache/enc/hits"], r["cache/enc/misses"]) for r in epochs] == [
        ("0", "0", str(N)),
        ("1", str(N), "0"),
    ]
    assert [r["kind"] for r in rows].count("step") == 6  # the step rows are still there


def test_a_graph_inside_a_module_of_ones_own_is_counted_too():
    class Wrapper(nn.Module):  # the user's own module around the graph's
        def __init__(self, g):
            super().__init__()
            self.inner = st.module(g)

        def forward(self, x):
            return self.inner(x)

    g = graph()
    result = fit(Wrapper(g), loader(), epochs=2)
    assert result.cache == {"enc": {"hits": N, "misses": N}}
    assert g.watchers == []


# -- resumed runs: the checkpoint carries the counts ------------------------------------


def checkpointed(tmp_path, keeper, watchers=()):
    g = graph(keeper=keeper)  # one keeper: the resumed run finds what the crashed one stored
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=3,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=2, keep=10),
        watchers=list(watchers),
        options=st.Options(progress=False),
    )
    return trainer, g


def crash_and_resume(tmp_path, edit=None):
    """Three epochs of three batches; crash at step 5 (epoch 1, all hits), resume from the
    mid-epoch checkpoint of step 4. ``edit`` may rewrite that checkpoint's payload first."""
    from somatize.torch import integrity
    from tests.torch.test_checkpoint_resume import Crash, CrashAt

    keeper = MemoryKeeper()
    trainer, g = checkpointed(tmp_path, keeper, [CrashAt(5)])
    with pytest.raises(Crash):
        trainer.fit(g, loader())
    path = tmp_path / "ckpt" / "step-000000004.ckpt"
    if edit is not None:
        payload = st.load_checkpoint(path)
        edit(payload)
        integrity.write_checkpoint(path, payload)
    rec = Recorder()
    trainer, g = checkpointed(tmp_path, keeper, [rec])
    return trainer.fit(g, loader(), resume=path), rec


def test_a_resumed_fit_counts_the_whole_run_as_an_uninterrupted_one(tmp_path):
    whole = fit(graph(), loader())
    assert whole.cache == {"enc": {"hits": 2 * N, "misses": N}}
    result, rec = crash_and_resume(tmp_path)
    assert result.steps == 9 and result.cache == whole.cache
    # the epoch resumed in its middle counts its steps from before the crash too
    assert [e.cache for e in rec.of(EpochEnd)] == [{"enc": {"hits": N, "misses": 0}}] * 2


def test_the_counts_are_plain_data_a_weights_only_load_reads(tmp_path):
    crash_and_resume(tmp_path)
    payload = torch.load(tmp_path / "ckpt" / "step-000000004.ckpt", weights_only=True)
    assert payload["cache"] == [
        {
            "total": {"enc": {"hits": 64, "misses": N}},  # epoch 0, and step 4 of epoch 1
            "epoch": {"enc": {"hits": 64, "misses": 0}},
            "warned": [],
            "whole": [],
        }
    ]


def test_a_checkpoint_from_before_the_counts_were_kept_still_resumes(tmp_path):
    result, _ = crash_and_resume(tmp_path, edit=lambda payload: payload.pop("cache"))
    assert result.steps == 9
    assert result.cache == {"enc": {"hits": 5 * 64, "misses": 0}}  # steps 5-9 alone


def test_counts_from_a_run_of_another_size_go_to_rank_0_summed():
    from somatize.torch.tally import resumed

    part = {"total": {"enc": {"hits": 3, "misses": 1}}, "epoch": {}, "warned": [], "whole": []}
    assert resumed([part, part], 1, 2) == part  # the same world: each rank its own
    assert resumed([part, part], 0, 1) == {"total": {"enc": {"hits": 6, "misses": 2}}}
    assert resumed([part, part], 1, 3) is None
    assert resumed(None, 0, 1) is None


def test_a_fit_resumed_into_a_fresh_memory_keeper_does_not_call_its_first_epoch_cold(tmp_path):
    def run(epochs, resume=None):  # a new graph, so a new, empty MemoryKeeper: a new process
        trainer = st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=epochs,
            checkpoint=st.Checkpointing(tmp_path / "ckpt"),
            watchers=[rec := Recorder()],
            options=st.Options(progress=False),
        )
        return trainer.fit(graph(), loader(), resume=resume), rec

    run(2)
    # (before: the checkpoint's misses counted as stored in this process, so the resumed
    # epoch, which finds an empty keeper and stores what it looks up, warned it went cold)
    result, rec = run(4, resume="last")  # warnings are errors here
    assert [e.cache for e in rec.of(EpochEnd)] == [
        {"enc": {"hits": 0, "misses": N}},  # stored again, as a first epoch does
        {"enc": {"hits": N, "misses": 0}},
    ]
    assert result.cache == {"enc": {"hits": 2 * N, "misses": 2 * N}}  # the whole run's
    cold = CacheTally({"total": {"enc": {"hits": 0, "misses": N}}})  # and after a resume,
    cold.on_event(CacheRows("r", "enc", 2, 0, N))  # an epoch it stored in, then a cold one,
    cold.end_epoch(2)
    cold.on_event(CacheRows("r", "enc", 3, 0, N))
    with pytest.warns(RuntimeWarning, match="none of its 192 lookups of epoch 4"):
        cold.end_epoch(3)  # still warns


def test_a_keeper_bounded_below_an_epoch_that_finds_some_rows_names_its_evictions():
    """Found by a memory-constrained user: a keeper holding half of an epoch's rows found
    14% of a warm epoch's rows, and the fit said nothing (it warned below one in ten)."""
    probe = MemoryKeeper()
    fit(graph(keeper=probe), loader(), epochs=1)
    half = probe.stats().bytes // 2  # half of what an epoch stores
    keeper = MemoryKeeper(max_bytes=half)
    with pytest.warns(RuntimeWarning, match="saves less than its share") as caught:
        result = fit(graph(keeper=keeper), loader(), epochs=2)
    hits = result.cache["enc"]["hits"]
    assert N // 10 <= hits < 9 * N // 10  # neither cold nor warm: before, no warning
    message = str(caught[0].message)
    assert message.startswith(f"The keeper evicted {keeper.stats().evicted:,} entries since")
    assert f"only {hits} of its {N} lookups of epoch 2" in message
    assert "give it policy='epochs'" in message  # (which keeps its share: below)


def test_an_unbounded_keeper_finding_every_row_says_nothing_of_evictions():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = fit(graph(keeper=MemoryKeeper()), loader(), epochs=2)
    assert result.cache["enc"] == {"hits": N, "misses": N}


def test_a_keeper_with_policy_epochs_finds_its_share_of_every_warm_epoch():
    """The same half-epoch room as above, kept while its entries are still read: each warm
    epoch finds half of its rows (least recently used eviction: a quarter of them here, one
    in seven over 30,000 rows), and
    serves them right (the run equals one without a cache)."""
    probe = MemoryKeeper()
    fit(graph(keeper=probe), loader(), epochs=1)
    half = probe.stats().bytes // 2
    found = {}
    for policy in ("lru", "epochs"):
        keeper = MemoryKeeper(max_bytes=half, policy=policy)
        rec = Recorder()
        with pytest.warns(RuntimeWarning, match="node 'enc' is cached") as caught:
            result = fit(graph(keeper=keeper), loader(), epochs=4, watchers=[rec])
        found[policy] = [e.cache["enc"]["hits"] for e in rec.of(EpochEnd)][1:]
        message = str(caught[0].message)
    assert all(h < N // 3 for h in found["lru"]), found  # (over 3 batches an epoch)
    assert all(h >= 0.45 * N for h in found["epochs"]), found
    assert keeper.stats().refused > 0
    # what the warning says of a keeper with the policy: it finds its share, no more
    assert message.startswith("The keeper evicted or refused ")
    assert f"MemoryKeeper(max_bytes={half:,}, policy='epochs') holds less than an" in message
    assert "finds that part at most" in message
    plain = fit(graph(per=None), loader(), epochs=4)
    for name, value in plain.state.items():
        assert torch.equal(value, result.state[name]), name
