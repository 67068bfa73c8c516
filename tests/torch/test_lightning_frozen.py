"""A backbone frozen and remembered per example, unfrozen mid-fit under Lightning (what its
``BackboneFinetuning`` does): a callback must unfreeze it in the graph too — one that only
adds its parameters to the optimizer is refused — and then the run equals plain PyTorch's
(batch norm and dropout back in training mode, the new group at its own rate, the cache
bypassed), through a refreeze, a partial unfreeze and a resume."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import (  # noqa: E402
    BackboneFinetuning,
    BaseFinetuning,
    ModelCheckpoint,
)

from somatize import Done, Graph, Node, Opaque  # noqa: E402
from somatize.errors import CheckpointError, SettingError  # noqa: E402
from somatize.torch.lightning import LightningGraph, result  # noqa: E402
from tests.torch.lightning_graphs import _trainer  # noqa: E402
from tests.torch.lightning_quiet import NO_VAL, QUIET  # noqa: E402

pytestmark = [
    *QUIET,
    NO_VAL,
    # frozen nodes are in eval mode at the start of training on purpose
    pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode"),
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
]
LR = 0.01


class Block(Node):
    def __init__(self, i: int, o: int, dropout: float = 0.2):
        self.net = nn.Sequential(nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU(), nn.Dropout(dropout))

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


class Head(Node):
    def __init__(self):
        self.out = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


class Unfreeze(BaseFinetuning):
    """docs/lightning.md's callback: unfreeze (and stop caching) ``node`` at epoch ``at``, its
    parameters a group at a tenth of the rate; freeze it again at ``again``."""

    def __init__(self, g: Graph, node: str, at: int, again: int | None = None):
        super().__init__()
        self.g, self.node, self.at, self.again, self.unfrozen = g, node, at, again, False

    def freeze_before_training(self, pl_module):
        pass  # g.freeze(node) froze it

    def state_dict(self):
        return {**super().state_dict(), "unfrozen": self.unfrozen}

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.unfrozen = state_dict["unfrozen"]

    def on_fit_start(self, trainer, pl_module):
        if self.unfrozen:  # resumed after the unfreezing: as the checkpoint was written
            self.g.freeze(self.node, False).cache(self.node, False)
        super().on_fit_start(trainer, pl_module)  # (gives the optimizer its groups back)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == self.at:
            self.g.freeze(self.node, False).cache(self.node, False)
            self.unfrozen = True
            mine = [p for n, p in pl_module.net.named_parameters() if n.startswith(f"{self.node}.")]
            optimizer.add_param_group({"params": mine, "lr": optimizer.param_groups[0]["lr"] / 10})
        if epoch == self.again:
            self.g.freeze(self.node).cache(self.node, per="example")
            self.unfrozen = False


class _ByEpoch(torch.utils.data.Sampler):
    """A shuffle drawn from the epoch's number (Lightning calls ``set_epoch``), so a plain loop
    reads the same order whatever else draws from a loader's generator."""

    def __init__(self, n: int):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(
            torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        )


def _data(shuffle: bool = True) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=gen)
    rows = TensorDataset(x, x[:, :3].argmax(dim=1))
    # (a generator of its own: a loader without one draws its workers' seed from torch's, as
    # each validation would, moving the dropout's masks)
    sampler = _ByEpoch(96) if shuffle else None
    return DataLoader(rows, batch_size=16, sampler=sampler, generator=torch.Generator())


def _lg(g: Graph) -> LightningGraph:
    return LightningGraph(g, loss=F.cross_entropy, optimizer=lambda ps: torch.optim.Adam(ps, LR))


def _plain(parts, head, epochs, at, trains, loader):
    """The same run by hand: ``parts`` (modules in order) train from epoch ``at`` where
    ``trains(i, epoch)`` says (else eval mode, no grad); a group of their parameters at a
    tenth of the rate joins Adam then. Returns each epoch's mean loss and the last step's
    gradients of ``parts``."""
    opt = torch.optim.Adam(head.parameters(), LR)
    losses, grads = [], []
    for epoch in range(epochs):
        if isinstance(loader.sampler, _ByEpoch):
            loader.sampler.set_epoch(epoch)
        if epoch == at:
            tuned = [p for i, m in enumerate(parts) if trains(i, epoch) for p in m.parameters()]
            opt.add_param_group({"params": tuned, "lr": LR / 10})
        head.train()
        total = count = 0.0
        for x, y in loader:
            h = x
            for i, m in enumerate(parts):
                m.train(trains(i, epoch))
                with torch.set_grad_enabled(trains(i, epoch)):
                    h = m(h)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad()
            loss.backward()
            grads[:] = [p.grad for m in parts for p in m.parameters()]
            opt.step()
            total, count = total + loss.item() * len(y), count + len(y)
        losses.append(total / count)
    return losses, grads


class _Grads(L.Callback):
    """The gradients of ``module``'s parameters at the last optimizer step."""

    def __init__(self, module: nn.Module):
        self.module, self.grads = module, []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads = [p.grad for p in self.module.parameters()]


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)


def test_backbone_finetuning_over_a_frozen_node_is_refused_before_any_step(tmp_path):
    torch.manual_seed(0)
    g = Graph.somatize(Block(8, 16).with_id("enc") >> Head().with_id("head"))
    g.freeze("enc").cache("enc", per="example")
    lg = _lg(g)
    lg.backbone = lg.net.enc  # what BackboneFinetuning asks of a LightningModule
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[BackboneFinetuning(1)])
    # (before: fitted, the backbone's group added, and the backbone never trained)
    with pytest.raises(SettingError, match=r"node 'enc' is frozen.*BackboneFinetuning would.*"
                       r"epoch 1.*g\.freeze\('enc', False\)\.cache\('enc', False\)"):  # fmt: skip
        trainer.fit(lg, _data())
    assert trainer.global_step == 0


def test_a_callback_adding_a_frozen_nodes_parameters_is_refused_at_that_epoch(tmp_path):
    class AddsOnly(BaseFinetuning):  # unfreezes as BackboneFinetuning does, not the graph
        def freeze_before_training(self, pl_module):
            pass

        def finetune_function(self, pl_module, epoch, optimizer):
            if epoch == 1:
                self.unfreeze_and_add_param_group(pl_module.net.enc.net[0], optimizer)

    torch.manual_seed(0)
    g = Graph.somatize(Block(8, 16).with_id("enc") >> Head().with_id("head"))
    g.freeze("enc").cache("enc", per="example")
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[AddsOnly()])
    with pytest.raises(SettingError, match=r"node 'enc' is frozen.*a callback turned its parameters' requires_grad on.*"
                       r"net\.enc\.net\.0\.weight.*make that part a node of its own"):  # fmt: skip
        trainer.fit(_lg(g), _data())
    assert trainer.global_step == 6  # the first epoch trained, then refused


# frozen again, its first epoch finds none of the rows the old weights made, as a first
# epoch: the tally does not warn (it did: "none of its 96 lookups of epoch 4 found...")
@pytest.mark.parametrize("again", [None, 3], ids=["unfrozen", "frozen-again"])
def test_unfreezing_a_cached_backbone_mid_fit_equals_plain_torch(tmp_path, again):
    torch.manual_seed(0)
    enc, head = Block(8, 16), Head()
    plain = copy.deepcopy([enc.net, head.out])
    g = Graph.somatize(enc.with_id("enc") >> head.with_id("head"))
    g.freeze("enc").cache("enc", per="example")
    lg, grads = _lg(g), _Grads(enc.net)
    trainer = _trainer(tmp_path, max_epochs=4, callbacks=[Unfreeze(g, "enc", 2, again), grads])
    torch.manual_seed(1)  # (the dropout's draws)
    trainer.fit(lg, _data(), _data(shuffle=False))
    r = result(trainer, lg)

    torch.manual_seed(1)
    trains = lambda i, e: 2 <= e < (again or 9)  # noqa: E731
    want, plain_grads = _plain(plain[:1], plain[1], 4, 2, trains, _data())
    assert r.epoch_losses == pytest.approx(want, rel=1e-6)
    _same(r.state, {
        **{f"enc.net.{k}": v for k, v in plain[0].state_dict().items()},
        **{f"head.out.{k}": v for k, v in plain[1].state_dict().items()},
    })  # fmt: skip
    if again is None:  # the backbone's last gradients, as plain PyTorch's
        assert len(grads.grads) == len(plain_grads) == 4
        for a, b in zip(grads.grads, plain_grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        assert [pg["lr"] for pg in trainer.optimizers[0].param_groups] == [LR, LR / 10]
        # epochs 0-1, then uncached (the sanity check stored the first 32 rows: they hit)
        assert r.cache == {"enc": {"hits": 96 + 32, "misses": 96 - 32}}
        assert enc.net[1].training and all(p.requires_grad for p in enc.net.parameters())
    else:  # frozen again at epoch 3: eval mode, new weights, so new rows
        assert r.cache == {"enc": {"hits": 96 + 32, "misses": 96 - 32 + 96}}
        assert not enc.net[1].training and g.memory.frozen == {"enc"}


def test_unfreezing_the_last_block_keeps_the_first_remembered(tmp_path):
    torch.manual_seed(0)
    b1, b2, head = Block(8, 16, 0.0), Block(16, 16), Head()
    plain = copy.deepcopy([b1.net, b2.net, head.out])
    g = Graph.somatize(b1.with_id("b1") >> b2.with_id("b2") >> head.with_id("head"))
    g.freeze("b1").freeze("b2").cache("b1", per="example").cache("b2", per="example")
    lg = _lg(g)
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[Unfreeze(g, "b2", 1)])
    torch.manual_seed(1)
    trainer.fit(lg, _data())
    r = result(trainer, lg)
    assert r.cache == {
        "b1": {"hits": 2 * 96, "misses": 96},  # (still frozen: every row found from epoch 1)
        "b2": {"hits": 0, "misses": 96},
    }

    torch.manual_seed(1)
    want, _ = _plain(plain[:2], plain[2], 3, 1, lambda i, e: i == 1 and e >= 1, _data())
    assert r.epoch_losses == pytest.approx(want, rel=1e-6)
    _same(r.state, {
        **{f"b1.net.{k}": v for k, v in plain[0].state_dict().items()},
        **{f"b2.net.{k}": v for k, v in plain[1].state_dict().items()},
        **{f"head.out.{k}": v for k, v in plain[2].state_dict().items()},
    })  # fmt: skip


def _resumable(tmp_path, callback=Unfreeze, ckpt_path=None):
    torch.manual_seed(0)
    g = Graph.somatize(Block(8, 16, 0.0).with_id("enc") >> Head().with_id("head"))
    g.freeze("enc").cache("enc", per="example")
    lg = _lg(g)
    every = ModelCheckpoint(tmp_path / "ckpt", filename="{epoch}", save_top_k=-1)
    trainer = _trainer(tmp_path, max_epochs=4, callbacks=[callback(g, "enc", 1), every])
    trainer.fit(lg, _data(shuffle=False), ckpt_path=ckpt_path)
    return result(trainer, lg)


@pytest.mark.parametrize("epoch", [0, 2], ids=["written-frozen", "written-unfrozen"])
def test_a_resume_across_the_unfreezing_equals_the_uninterrupted_run(tmp_path, epoch):
    whole = _resumable(tmp_path)
    resumed = _resumable(tmp_path, ckpt_path=tmp_path / "ckpt" / f"epoch={epoch}.ckpt")
    assert resumed.epoch_losses == pytest.approx(whole.epoch_losses, rel=1e-6)
    _same(resumed.state, whole.state)


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")  # (Forgets)
def test_a_checkpoint_written_unfrozen_is_not_resumed_frozen(tmp_path):
    class Forgets(Unfreeze):  # does not unfreeze again when resumed after the unfreezing
        def on_fit_start(self, trainer, pl_module):
            BaseFinetuning.on_fit_start(self, trainer, pl_module)

    _resumable(tmp_path)
    written = torch.load(tmp_path / "ckpt" / "epoch=2.ckpt", weights_only=True)
    assert written["hyper_parameters"]["frozen"] == []  # the graph's when written
    # (before: resumed with 'enc' frozen, silently never trained again)
    with pytest.raises(CheckpointError, match=r"node 'enc' trainable, which this graph freezes"):
        _resumable(tmp_path, Forgets, tmp_path / "ckpt" / "epoch=2.ckpt")
