"""Checkpoint integrity: checksums verified on load, payloads checked, full disks, fallback."""

from __future__ import annotations

import errno
import io
import random
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import CheckpointError
from somatize.torch import integrity
from somatize.torch.verify import verify_checkpoints, verify_command


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data():
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen))] * 3


def trainer(ckpt, optimizer=None, **kw):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=optimizer or (lambda ps: torch.optim.Adam(ps, lr=1e-2)),
        epochs=2,
        checkpoint=st.Checkpointing(ckpt, every_steps=1, keep=10),
        options=st.Options(progress=False),
        **kw,
    )


def fit(ckpt, resume=None, optimizer=None):
    torch.manual_seed(0)
    return trainer(ckpt, optimizer).fit(Graph.somatize(Linear()), data(), resume=resume)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("run") / "ckpt"
    return ckpt, fit(ckpt)


@pytest.fixture
def good(run, tmp_path):
    src = run[0] / "step-000000006.ckpt"
    dst = tmp_path / src.name
    dst.write_bytes(src.read_bytes())
    return dst


def test_every_checkpoint_ends_in_the_blake3_of_its_archive_and_torch_still_reads_it(good):
    from blake3 import blake3

    data = good.read_bytes()
    assert data[-integrity.TRAILER : -32] == integrity.MAGIC
    assert data[-32:] == blake3(data[: -integrity.TRAILER]).digest()
    assert integrity.verify_file(good) is True
    plain = torch.load(good, weights_only=True)  # a plain torch file still
    assert plain["step"] == 6


def test_a_flipped_bit_anywhere_is_a_checkpoint_error_naming_the_file(good, tmp_path):
    data = good.read_bytes()
    rng = random.Random(0)
    bad = tmp_path / "bad.ckpt"
    for _ in range(20):
        flipped = bytearray(data)
        i = rng.randrange(len(data))
        flipped[i] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match=r"bad\.ckpt.*(corrupt|truncated)"):
            st.load_checkpoint(bad)


def test_a_checkpoint_from_before_checksums_loads_with_a_warning(good, tmp_path):
    old = tmp_path / "old.ckpt"
    old.write_bytes(good.read_bytes()[: -integrity.TRAILER])
    with pytest.warns(UserWarning, match=r"old\.ckpt has no checksum"):
        assert st.load_checkpoint(old)["step"] == 6
    assert [v.status for v in verify_checkpoints(old)] == ["unverified"]


def resave(payload, path):
    integrity.write_checkpoint(path, payload)
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.pop("seed"), "missing 'seed'"),
        (lambda p: p.pop("rng"), "missing 'rng'"),
        (lambda p: p.update(step="6"), "'step' is str '6', not an int"),
        (lambda p: p.update(losses=None), "'losses' is NoneType None, not a list"),
        (lambda p: p.update(position=10**6), "'position'=1000000 is out of range"),
        (lambda p: p.update(position=-1), "'position'=-1 is out of range"),
        (lambda p: p.update(epoch=-2), "'epoch'=-2 is negative"),
        (lambda p: p["model"].update({"lin.weight": 3}), "'model' entry '.*' is not a tensor"),
        (lambda p: p.update(optimizer={"lr": 1}), "'optimizer' lacks 'state'"),
        (lambda p: p["rng"].pop("torch"), "'rng' lacks"),
        (lambda p: p.update(pruned="no"), "'pruned' is str 'no', not a bool"),
    ],
)
def test_an_incomplete_or_foreign_payload_names_what_is_wrong(good, tmp_path, change, message):
    payload = st.load_checkpoint(good)
    payload = {k: (dict(v) if isinstance(v, dict) else v) for k, v in payload.items()}
    change(payload)
    bad = resave(payload, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointError, match=rf"bad\.ckpt is not a complete .*{message}"):
        st.load_checkpoint(bad)


def test_resuming_with_another_optimizer_class_names_both(run):
    sgd = lambda ps: torch.optim.SGD(ps, lr=1e-2)  # noqa: E731
    with pytest.raises(CheckpointError, match=r"torch\.optim\.adam\.Adam.*torch\.optim\.sgd\.SGD"):
        fit(run[0], resume=run[0] / "step-000000003.ckpt", optimizer=sgd)


def test_an_old_checkpoint_without_the_class_still_tells_another_optimizer(good, tmp_path):
    payload = st.load_checkpoint(good)
    del payload["optimizer_class"]
    old = resave(payload, tmp_path / "step-000000006.ckpt")
    sgd = lambda ps: torch.optim.SGD(ps, lr=1e-2)  # noqa: E731
    with pytest.raises(CheckpointError, match=r"not this run's torch\.optim\.sgd\.SGD.*betas"):
        fit(tmp_path / "other", resume=old, optimizer=sgd)


def test_a_changed_learning_rate_warns_with_old_and_new_values_and_the_checkpoint_wins(run):
    faster = lambda ps: torch.optim.Adam(ps, lr=0.5)  # noqa: E731
    with pytest.warns(UserWarning, match=r"'lr' of group 0 changed: .* has 0\.01, .* 0\.5"):
        result = fit(run[0], resume=run[0] / "step-000000003.ckpt", optimizer=faster)
    for name, value in run[1].state.items():  # exact resume: the checkpoint's lr was kept
        assert torch.equal(result.state[name], value)


def test_resume_last_falls_back_to_the_newest_intact_checkpoint_and_says_so(run, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in run[0].iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    newest = ckpt / "step-000000006.ckpt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x10
    newest.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"step-000000006\.ckpt is damaged.*step-000000005"):
        assert st.Checkpointing(ckpt).last() == ckpt / "step-000000005.ckpt"
    with pytest.warns(UserWarning, match="falling back"):
        result = fit(ckpt, resume="last")
    assert result.steps == 6
    for name, value in run[1].state.items():  # one step re-trained: the same weights
        assert torch.equal(result.state[name], value)


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for step in (1, 2):
        (ckpt / f"step-{step:09d}.ckpt").write_bytes(b"junk")
    (ckpt / "last").write_text("step-000000002.ckpt")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint in .*older one"):
        st.Checkpointing(ckpt).last()


class FullDisk(io.RawIOBase):
    """A file whose writes fail with ENOSPC after ``room`` bytes."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, b) -> int:
        n = memoryview(b).nbytes
        if n > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= n
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()


@pytest.mark.parametrize("room", [0, 100, 5000])
def test_a_full_disk_is_a_checkpoint_error_naming_the_file_and_nothing_is_damaged(
    run, tmp_path, monkeypatch, room
):
    import contextlib

    ckpt = st.Checkpointing(tmp_path / "ckpt")
    payload = st.load_checkpoint(run[0] / "step-000000006.ckpt")
    payload.pop("format")
    ckpt.save(payload, 6)
    before = {p.name: p.read_bytes() for p in ckpt.path.iterdir()}
    real = integrity.atomic_file

    @contextlib.contextmanager
    def full(path, **kwargs):
        with real(path, **kwargs) as f:
            yield FullDisk(f, room)

    monkeypatch.setattr(integrity, "atomic_file", full)
    with pytest.raises(CheckpointError, match=r"step-000000007\.ckpt: No space left") as e:
        ckpt.save(payload, 7)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in ckpt.path.iterdir()} == before


def test_checkpoint_verify_reports_every_file_and_fails_on_a_damaged_one(run, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in run[0].iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    assert verify_command(str(ckpt)) == 0
    assert "0 damaged" in capsys.readouterr().out
    victim = ckpt / "step-000000004.ckpt"
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    assert verify_command(str(ckpt)) == 1
    out = capsys.readouterr().out
    assert "damaged   " in out and "step-000000004.ckpt" in out and "1 damaged" in out
    (ckpt / "last").write_text("step-000000004.ckpt")
    statuses = {v.path.name: v.status for v in verify_checkpoints(ckpt)}
    assert statuses["last"] == "damaged" and statuses["step-000000005.ckpt"] == "ok"
    assert verify_command(str(tmp_path / "nowhere")) == 2


def test_the_cli_verifies_and_the_core_cli_does_not_import_torch(run, subprocess_env):
    code = "import sys, somatize.cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env)
    out = subprocess.run(
        [sys.executable, "-m", "somatize.cli", "checkpoint", "verify", str(run[0])],
        capture_output=True,
        text=True,
        env=subprocess_env,
    )
    assert out.returncode == 0, out.stderr
    assert "ok         " in out.stdout and "0 damaged" in out.stdout


def test_an_empty_last_pointer_means_the_newest_intact_checkpoint(run, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in run[0].iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    (ckpt / "last").write_bytes(b"")  # what a power cut can leave of an unsynced pointer
    assert st.Checkpointing(ckpt).last() == ckpt / "step-000000006.ckpt"
    for f in ckpt.glob("step-*"):
        f.unlink()
    assert st.Checkpointing(ckpt).last() is None


def test_a_save_sets_the_disk_writing_each_large_tensor_before_its_one_fsync(
    run, tmp_path, monkeypatch
):
    # the bytes go to the disk while the rest is serialized and hashed (sync_file_range),
    # not all of them inside the fsync: every byte of the archive up to the last large
    # tensor, in order, each range once, all before the file's fsync
    import os

    payload = st.load_checkpoint(run[0] / "step-000000006.ckpt")
    payload.pop("format")
    payload["model"] = {f"w{i}": torch.randn(300_000) for i in range(3)}  # 1.2 MB each
    events: list[tuple] = []
    monkeypatch.setattr(integrity, "start_writeback", lambda *a: events.append(("wb", *a)))
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", fd)), real_fsync(fd)))
    path = st.Checkpointing(tmp_path / "ckpt").save(payload, 1)
    # a fresh directory's empty 'last' (its directory fsync), the three tensors' writeback,
    # the data fsync, the one directory fsync after the renames
    assert [e[0] for e in events] == ["fsync", "wb", "wb", "wb", "fsync", "fsync"]
    wb = events[1:4]
    assert [e[2] for e in wb] == [0, wb[0][3], wb[0][3] + wb[1][3]]  # contiguous from 0
    end = wb[-1][2] + wb[-1][3]
    assert 3 * 1_200_000 < end <= path.stat().st_size - integrity.TRAILER
    torch.testing.assert_close(st.load_checkpoint(path)["model"], payload["model"])
