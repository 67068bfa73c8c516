"""The tensor codec's digest memo holds tensors, never a weak reference to one (which
``torch.utils.swap_tensors`` refuses), and lets go of those only it holds."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from somatize.torch import TensorCodec, tensor_memo
from somatize.torch.tensor_memo import TensorMemo


def test_a_fingerprinted_module_swaps_and_its_fingerprint_follows() -> None:
    c = TensorCodec()
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()
    first = c.fingerprint(net)
    assert c.fingerprint(net) == first and c.hashed == 7  # (served from the memo)
    assert all(weakref.getweakrefs(t) == [] for t in [*net.parameters(), *net.buffers()])
    weight = net[0].weight
    torch.utils.swap_tensors(weight, nn.Parameter(weight.detach().double()))  # (no error)
    swapped = c.fingerprint(net)
    assert swapped != first and swapped == TensorCodec().fingerprint(net)
    assert c.hashed == 8  # the swapped weight, hashed anew; the rest still from the memo


def test_a_swapped_tensor_is_hashed_anew_even_at_its_old_address() -> None:
    """Swapped, a tensor is the same Python object with other contents: its digest is
    never served from before the swap."""
    c = TensorCodec()
    t = torch.zeros(4)
    before = c.digest(t)
    torch.utils.swap_tensors(t, torch.ones(4))
    assert c.digest(t) != before and c.digest(t) == TensorCodec().digest(torch.ones(4))


def test_tensors_only_the_memo_holds_are_let_go_once_enough_was_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tensor_memo, "_RETAIN", 1000)  # bytes added between prunings
    c = TensorCodec()
    kept = torch.arange(10.0)  # 40 bytes, alive throughout
    c.digest(kept)
    dead = []
    for i in range(40):  # 40 bytes each: a pruning at the 25th (1,040 bytes added)
        t = torch.full((10,), float(i))
        c.digest(t)
        dead.append(weakref.ref(t))
        del t
    assert [r() is None for r in dead] == [True] * 24 + [False] * 16  # (the rest still wait)
    assert len(c._memo) == 17
    hashed = c.hashed
    assert c.digest(kept) == TensorCodec().digest(kept) and c.hashed == hashed  # still kept
    c.forget()
    assert all(r() is None for r in dead) and len(c._memo) == 0


def test_the_memo_lets_go_once_it_holds_its_limit_of_entries() -> None:
    memo = TensorMemo()
    alive = [torch.zeros(1) for _ in range(4095)]
    for t in alive:
        memo.keep(t, (), "")
    gone = torch.zeros(1)
    probe = weakref.ref(gone)
    memo.keep(gone, (), "")
    del gone
    assert probe() is not None and len(memo) == 4096  # (held by the memo alone)
    memo.keep(alive[0], (), "")  # (known: no pruning)
    assert probe() is not None
    memo.keep(torch.zeros(1), (), "")  # (a new one at the limit: a pruning, first)
    assert probe() is None and len(memo) == 4096
    assert memo._limit == 2 * 4095  # (the live ones kept: room for as many again)
