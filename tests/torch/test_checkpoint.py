"""Checkpoint files: atomic, pruned to ``keep``, read with weights_only=True only."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import CheckpointError
from somatize.torch import integrity
from somatize.torch.checkpoint import rng_state, set_rng_state


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def train(tmp_path, **kw):
    torch.manual_seed(0)
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=2,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=1, **kw),
        options=st.Options(progress=False),
    )
    return trainer.fit(Graph.somatize(Linear()), data)


def ckpts(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))


def test_checkpoints_hold_everything_and_keep_the_newest(tmp_path):
    result = train(tmp_path, keep=2)
    directory = tmp_path / "ckpt"
    assert ckpts(directory) == ["step-000000005.ckpt", "step-000000006.ckpt"]
    assert (directory / "last").read_text() == "step-000000006.ckpt"
    assert result.checkpoint == str(directory / "step-000000006.ckpt")
    assert not [p for p in os.listdir(directory) if p.endswith(".tmp")]
    payload = st.load_checkpoint(directory / "step-000000006.ckpt")
    assert (payload["step"], payload["epoch"], payload["position"]) == (6, 2, 0)
    assert payload["losses"] == result.losses
    assert set(payload["rng"]) >= {"python", "torch", "cuda", "numpy"}
    assert payload["optimizer"]["state"]  # Adam's moments
    for name, value in result.state.items():
        assert torch.equal(payload["model"][name], value)


class Steps:
    """A watcher (it sends the fit down the general loop, not the fast one)."""

    def on_event(self, event):
        pass


class Unsized:
    """Batches without a length: where an epoch ends is learnt only when it has."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


@pytest.mark.parametrize("loop", ["fast", "general", "unsized"])
def test_the_checkpoint_of_an_epochs_last_step_is_written_once(tmp_path, monkeypatch, loop):
    from somatize.torch import integrity

    written = []
    real = integrity.write_checkpoint
    monkeypatch.setattr(
        integrity,
        "write_checkpoint",
        lambda path, *a, **kw: written.append(path.name) or real(path, *a, **kw),
    )
    torch.manual_seed(0)
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=2,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=1, keep=10),
        watchers=[Steps()] if loop == "general" else [],
        options=st.Options(progress=False),
    )
    trainer.fit(Graph.somatize(Linear()), Unsized(data) if loop == "unsized" else data)
    twice = ["step-000000003.ckpt", "step-000000006.ckpt"] if loop == "unsized" else []
    # (before: steps 3 and 6 written twice, at the step and at the epoch's end, whatever
    # the data; without a length the loop cannot know the step ends the epoch)
    assert sorted(written) == sorted([f"step-00000000{i}.ckpt" for i in range(1, 7)] + twice)
    payload = st.load_checkpoint(tmp_path / "ckpt" / "step-000000003.ckpt")
    assert (payload["epoch"], payload["position"]) == (1, 0)  # the epoch end's


def test_saving_never_deletes_the_checkpoint_last_names(tmp_path):
    directory = tmp_path / "ckpt"
    train(tmp_path, keep=2)
    (directory / ".step-000000101.ckpt.abc.tmp").write_bytes(b"torn")  # a killed writer's
    torch.manual_seed(0)
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=3,
        checkpoint=st.Checkpointing(directory, every_steps=1, keep=2),
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Linear()), data, resume="last")
    last = st.Checkpointing(directory).last()
    assert last.name == "step-000000009.ckpt"
    assert st.load_checkpoint(last)["step"] == 9
    assert not (directory / ".step-000000101.ckpt.abc.tmp").exists()


def test_last_missing_means_no_checkpoint_and_garbage_in_last_is_an_error(tmp_path):
    c = st.Checkpointing(tmp_path)
    assert c.last() is None
    (tmp_path / "last").write_text("../../etc/passwd")
    with pytest.raises(CheckpointError, match="does not name a checkpoint"):
        c.last()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="keep"):
        st.Checkpointing("x", keep=0)
    with pytest.raises(ValueError, match="every_steps"):
        st.Checkpointing("x", every_steps=0)


# -- damaged, foreign and malicious files ------------------------------------------------


@pytest.fixture
def good(tmp_path):
    train(tmp_path)
    return st.Checkpointing(tmp_path / "ckpt").last()


@pytest.mark.parametrize("keep", [0, 10, 100, 1000, -100, -1])
def test_a_truncated_checkpoint_is_a_checkpoint_error(good, tmp_path, keep):
    data = good.read_bytes()
    torn = tmp_path / "torn.ckpt"
    torn.write_bytes(data[:keep])  # the first bytes, or all but the last -keep
    with pytest.raises(CheckpointError, match="truncated"):
        st.load_checkpoint(torn)


def test_flipped_bytes_give_a_checkpoint_error(good, tmp_path):
    data = bytearray(good.read_bytes())
    # damage the pickled payload inside the archive (a zip still, but wrong content)
    with zipfile.ZipFile(good) as z:
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        info = z.getinfo(name)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start, start + 40):
        data[i] ^= 0xFF
    bad = tmp_path / "flipped.ckpt"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        st.load_checkpoint(bad)


@pytest.mark.parametrize("content", [b"", b"hello world", b"\x80\x02garbage" * 10])
def test_files_that_are_not_torch_archives_are_refused(tmp_path, content):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(content)
    with pytest.raises(CheckpointError, match="not a torch checkpoint"):
        st.load_checkpoint(bad)


def test_a_torch_file_that_is_not_ours_is_refused(tmp_path):
    foreign = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="not a somatize Trainer checkpoint"):
        st.load_checkpoint(foreign)
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*missing\.ckpt; give the path"):
        st.load_checkpoint(tmp_path / "missing.ckpt")


@pytest.mark.parametrize(
    ("fmt", "says"),
    [
        ("somatize.checkpoint/2", r"format 'somatize.checkpoint/2', written by a newer version"),
        ("somatize.checkpoint/0", r"format 'somatize.checkpoint/0', written by another version"),
    ],
)
def test_a_checkpoint_of_another_somatize_version_says_so_and_where_its_weights_are(
    good, tmp_path, fmt, says
):
    payload = {**st.load_checkpoint(good), "format": fmt}
    other = tmp_path / "other.ckpt"
    integrity.write_checkpoint(other, payload)
    with pytest.raises(CheckpointError, match=says) as e:
        st.load_checkpoint(other)
    assert "not a somatize Trainer checkpoint" not in str(e.value)
    assert "weights_only=True)['model']" in str(e.value)
    # the fix it names works: the weights load with torch alone, and fit the graph
    weights = torch.load(other, map_location="cpu", weights_only=True)["model"]
    st.load_state(Graph.somatize(Linear()), weights)


def test_none_for_a_path_names_where_a_none_comes_from(tmp_path):
    nowhere = st.Checkpointing(tmp_path / "typo")
    assert nowhere.best_file() is None and nowhere.last() is None
    with pytest.raises(
        TypeError, match=r"not None; .*None is what .*last\(\) and \.best_file\(\) return"
    ):
        st.load_checkpoint(nowhere.best_file())  # type: ignore[arg-type]


class Evil:
    """Unpickling this would create the marker file."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_malicious_pickle_is_never_executed(tmp_path, how):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    payload = {"format": "somatize.checkpoint/1", "model": Evil(marker)}
    if how == "torch.save":
        torch.save(payload, evil)
    else:
        evil.write_bytes(pickle.dumps(payload))
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=r"not loaded|not a torch checkpoint"):
        st.load_checkpoint(evil)
    assert not marker.exists()
    # and resuming from it goes through the same door
    trainer = st.Trainer(optimizer=torch.optim.SGD, options=st.Options(progress=False))
    with pytest.raises(CheckpointError):
        trainer.fit(Graph.somatize(Linear()), [torch.zeros(1, 3)], resume=evil)
    assert not marker.exists()
    # the control: plain pickle would have run it
    pickle.loads(pickle.dumps(Evil(marker)))
    assert marker.exists()


def test_a_malicious_pickle_inside_a_real_checkpoint_layout_is_refused(good, tmp_path):
    marker = tmp_path / "pwned"
    payload = st.load_checkpoint(good)
    payload["rng"]["python"][2] = Evil(marker)  # hidden deep inside
    buf = io.BytesIO()
    torch.save(payload, buf)
    evil = tmp_path / "step-000000999.ckpt"
    evil.write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match="may be malicious"):
        st.load_checkpoint(evil)
    assert not marker.exists()


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    import random

    import numpy as np

    state = rng_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    a = (random.random(), np.random.rand(), torch.rand(2))
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True))
    b = (random.random(), np.random.rand(), torch.rand(2))
    assert a[:2] == b[:2]
    assert torch.equal(a[2], b[2])
