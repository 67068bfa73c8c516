"""What a model carrying state (st.Carry) cannot do, said before it goes wrong: a cached node
holding one (a hit would not move the state on), a Carry in a list found like any other, a
sampler drawing in random order, a short last batch, an evaluation dealt out to DDP ranks;
and a step skipped for a non-finite loss does not pass its state on."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

import somatize.torch as st
from somatize import CacheError, Done, Graph, Node, Opaque
from somatize.errors import SettingError
from somatize.torch import inference
from tests.torch.test_checkpoint_resume import Crash, CrashAt
from tests.torch.test_trainer_carry import Recurrent, carried_fit, data


class Stream(Node):
    """A frozen encoder that carries its state from call to call."""

    def __init__(self) -> None:
        self.rnn = nn.GRU(3, 4, batch_first=True)
        self.hidden = st.Carry()

    def forward(self, x, ctx):
        out, h = self.rnn(x, self.hidden.value)
        self.hidden.set(h)
        return Done(out[:, -1])


@pytest.mark.parametrize("per", ["batch", "example"])
def test_a_cached_node_that_carries_state_is_refused(per):
    # before: the second call of the same window was served the first call's output, the
    # state standing still, with no warning
    g = Graph.somatize(Stream().with_id("enc")).freeze("enc").cache("enc", per=per)
    with pytest.raises(CacheError, match=r"node 'enc' is cached, but it carries state.*\.hidden"):
        st.module(g)(torch.randn(2, 5, 3))


class Layers(Recurrent):
    """Two carried states, one a layer, in a list."""

    def __init__(self) -> None:
        super().__init__()
        self.hiddens = [self.hidden, st.Carry()]
        del self.hidden

    def forward(self, x, ctx):
        out, h = self.rnn(x, self.hiddens[0].value)
        self.hiddens[0].set(h)
        self.hiddens[1].set(out[:, -1:].detach())
        return Done(Opaque(self.out(out[:, -1])))


def test_a_carry_in_a_list_is_found_refused_with_micro_batches_and_checkpointed(tmp_path):
    # before: invisible — micro_batches accepted, no reset before evaluate, not checkpointed
    from somatize.torch.carry import named_carries

    g = Graph.somatize(Layers().with_id("lm"))
    assert sorted(named_carries(st.module(g))) == [
        "node 'lm' (.hiddens[0])",
        "node 'lm' (.hiddens[1])",
    ]
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        micro_batches=2,
        options=st.Options(progress=False, shuffle=False),
    )
    with pytest.raises(SettingError, match=r"node 'lm' \(\.hiddens\[0\]\)"):
        trainer.fit(g, data(4))
    with pytest.raises(Crash):
        carried_fit(tmp_path / "c", Layers, [CrashAt(3)])  # last checkpoint: batch 2 of 5
    payload = st.load_checkpoint(st.Checkpointing(tmp_path / "c").last())
    assert payload["position"] == 2 and len(payload["carry"][0]) == 2
    assert all(entry["value"] is not None for entry in payload["carry"][0])


def loader(n: int, **kw) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    rows = TensorDataset(torch.randn(n, 4, 3, generator=gen), torch.randint(0, 2, (n,)))
    return DataLoader(rows, **kw)


def trainer(shuffle: bool = True) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False, shuffle=shuffle),
    )


def test_a_sampler_drawing_in_random_order_warns_as_shuffle_does():
    sampler = SubsetRandomSampler(range(8))
    with pytest.warns(UserWarning, match=r"draws its rows in random order \(a SubsetRandomSampler"):
        trainer().fit(Graph.somatize(Recurrent()), loader(8, batch_size=2, sampler=sampler))


def test_a_short_last_batch_is_warned_of_before_the_run_naming_drop_last():
    # before: a shape error from the GRU at the epoch's end, naming no cause
    short = r"last batch of fit\(\)'s train has 1 rows, not 2"
    with pytest.warns(UserWarning, match=short) as w, pytest.raises(RuntimeError):
        trainer().fit(Graph.somatize(Recurrent()), loader(7, batch_size=2))
    assert "drop_last=True" in str(w[0].message)
    trainer().fit(Graph.somatize(Recurrent()), loader(7, batch_size=2, drop_last=True))
    val = {"a": loader(3, batch_size=2)}
    with (
        pytest.warns(UserWarning, match=r"last batch of val set 'a' has 1 rows"),
        pytest.raises(RuntimeError),
    ):
        trainer(shuffle=False).fit(Graph.somatize(Recurrent()), data(2), val=val)


def test_evaluate_under_ddp_warns_that_each_rank_skips_the_others_batches(monkeypatch):
    monkeypatch.setattr(inference.ddp, "rank_world", lambda: (0, 2))
    t = trainer()
    monkeypatch.setattr(t, "_evaluate", lambda *a: {"val_loss": 0.0})  # (no process group)
    monkeypatch.setattr(inference, "agree", lambda *a, **k: None)  # (nor its lengths')
    with pytest.warns(UserWarning, match=r"under DDP evaluate\(\) deals the batches out"):
        t.evaluate(Graph.somatize(Recurrent().with_id("lm")), data(2))


@pytest.mark.parametrize("path", ["fast", "watched"])
def test_a_skipped_step_does_not_pass_its_non_finite_state_on(path):
    # before: the NaN state of the skipped batch was carried on, and every step after it
    # was skipped too (34 of 40 in the audit's run), silently
    batches = data(6)
    batches[2] = (torch.full_like(batches[2][0], float("nan")), batches[2][1])
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        watchers=[st.CSVLog(os.devnull)] if path == "watched" else [],
        options=st.Options(progress=False, shuffle=False, nonfinite="skip"),
    ).fit(Graph.somatize(Recurrent()), batches)
    assert result.skipped == 2 and result.steps == 10  # the NaN batch alone, each epoch
    assert all(math.isfinite(v) for v in result.losses)


def test_a_cached_node_that_carries_state_is_refused_inside_a_subgraph():
    # the outer graph caches nothing: module(g) still looks into its subgraphs
    inner = Graph.somatize(Stream().with_id("enc")).freeze("enc").cache("enc")
    g = Graph.somatize(Stream().with_id("pre") >> inner.with_id("block"))
    assert not (g.memory.cached or g.memory.named)
    with pytest.raises(CacheError, match=r"node 'enc' is cached, but it carries state.*\.hidden"):
        st.module(g)
