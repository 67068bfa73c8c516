"""The tensor codec's digest memo: a module's fingerprint memoised until a step, following
every change (batch norm statistics, mode, structure, extra state), and its own walk of
the modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from somatize.torch import TensorCodec
from somatize.torch.fingerprints import _named_modules

# -- the digest memo --------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=False),
        lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True),
        lambda ps: torch.optim.Adam(ps, lr=0.1),
    ],
    ids=["sgd", "sgd-foreach", "adam"],
)
def test_module_digest_is_memoised_until_an_optimizer_step(make_opt):
    c = TensorCodec()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()  # 4 parameters, 3 buffers
    first = c.fingerprint(net)
    assert c.hashed == 7
    assert c.fingerprint(net) == first
    assert c.hashed == 7  # unchanged: served from the version memo
    opt = make_opt(net[0].parameters())
    net(torch.randn(4, 3)).pow(2).sum().backward()
    opt.step()
    after = c.fingerprint(net)
    assert after != first
    assert c.hashed == 9  # the linear's weight and bias, nothing else
    assert c.fingerprint(net) == after and c.hashed == 9


def test_batch_norm_statistics_updated_in_training_mode_change_the_digest():
    """Batch norm writes its running statistics without moving their version counter."""
    c = TensorCodec()
    net = nn.BatchNorm1d(3)
    mean = net.running_mean
    version = mean._version
    first = c.fingerprint(net)
    net(torch.randn(5, 3) + 3.0)
    assert mean._version == version and not torch.equal(mean, torch.zeros(3))  # the trap
    assert c.fingerprint(net) != first


def test_module_digest_covers_training_mode_and_structure():
    c = TensorCodec()
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))
    train = c.fingerprint(net)
    assert c.fingerprint(net.eval()) != train
    assert c.fingerprint(nn.Sequential(net[0], nn.Identity()).eval()) != c.fingerprint(net)


def test_a_module_fingerprint_served_from_its_memo_follows_every_change():
    """The memo returns a module's last fingerprint only when all it was made of is equal;
    each change below must give the fingerprint a fresh computation would."""

    class Stateful(nn.Linear):
        def __init__(self) -> None:
            super().__init__(2, 2)
            self.note = 0

        def get_extra_state(self) -> int:
            return self.note

        def set_extra_state(self, state: int) -> None:
            self.note = state

    def fresh(net: nn.Module) -> str | None:
        return TensorCodec().fingerprint(net)

    c = TensorCodec()
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).eval()
    seen = {c.fingerprint(net)}
    assert c.fingerprint(net) == fresh(net)

    def changed() -> None:
        fp = c.fingerprint(net)
        assert fp == fresh(net) and fp not in seen
        seen.add(fp)

    with torch.no_grad():
        net[0].weight.add_(1.0)  # in place: the version counter moves
    changed()
    net[0].bias = nn.Parameter(torch.zeros(2))  # replaced
    changed()
    net[1] = nn.BatchNorm1d(2, eps=0.5)  # another submodule (its buffers are new tensors)
    with torch.no_grad():
        net[1].running_var.fill_(3.0)
    changed()
    net.train()
    changed()
    net.append(nn.Identity())  # structure
    changed()
    extra = nn.Sequential(Stateful()).eval()
    before = c.fingerprint(extra)
    extra[0].note = 1  # no tensor moves: a module with extra state is never memoised
    assert c.fingerprint(extra) != before and c.fingerprint(extra) == fresh(extra)


def test_memo_forgets_dead_tensors_and_never_confuses_a_new_one():
    c = TensorCodec()
    digests = set()
    for i in range(50):
        t = torch.full((2,), float(i))  # ids are reused as tensors die
        digests.add(c.digest(t))
    assert len(digests) == 50 and c.hashed == 50


def test_the_fingerprint_walks_modules_as_named_modules_does() -> None:
    """Its own walk: the same names, in the same order, a shared module named where it is
    first reached, None children skipped, cycles-free nesting at any depth."""
    shared = nn.Linear(2, 2)
    inner = nn.Sequential(shared, nn.ReLU(), nn.Sequential(nn.Tanh(), shared))
    root = nn.ModuleDict({"b": inner, "a": shared, "c": nn.ModuleList([inner, nn.Identity()])})
    root.register_module("gone", None)
    deep: nn.Module = nn.Identity()
    for _ in range(30):
        deep = nn.Sequential(deep, nn.ReLU())
    for m in (root, inner, shared, deep, nn.TransformerEncoderLayer(8, 2, 16)):
        assert _named_modules(m) == list(m.named_modules())


def test_a_module_fingerprint_from_its_memos_equals_one_made_afresh() -> None:
    """The memo path (unchanged weights and settings read back, no hashing) gives what a
    new codec, hashing everything, gives — after each kind of change, too."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.LeakyReLU(0.1)).eval()

    def step_weights() -> None:
        with torch.no_grad():
            net[0].weight.add_(1.0)

    changes = [
        lambda: None,
        step_weights,
        lambda: setattr(net[2], "negative_slope", 0.3),
        lambda: net.train(),
        lambda: net[1].running_mean.add_(1.0),  # in training mode: buffers hashed each time
        lambda: net.eval(),
        lambda: setattr(net[0], "bias", nn.Parameter(torch.zeros(4))),
    ]
    warm, seen = TensorCodec(), []
    for change in changes:
        change()
        got = warm.fingerprint(net)
        assert got == TensorCodec().fingerprint(net)
        seen.append(got)
    assert len(set(seen)) == len(seen)  # every change is seen
    hashed = warm.hashed
    assert warm.fingerprint(net) == seen[-1] and warm.hashed == hashed  # read from the memos
