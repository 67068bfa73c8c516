"""A checkpoint directory: pointers read safely, earlier runs' files left alone, one writer."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Graph
from somatize.errors import CheckpointError, SettingError
from somatize.torch import checkpoint, ckptspare, integrity
from somatize.torch.verify import verify_checkpoints
from tests.torch.test_integrity import Linear, data


def fit(ckpt, epochs=2, resume=None, keep=10, seed=0):
    torch.manual_seed(0)
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=epochs,
        seed=seed,
        checkpoint=st.Checkpointing(ckpt, every_steps=1, keep=keep),
        options=st.Options(progress=False),
    ).fit(Graph.somatize(Linear()), data(), resume=resume)


def names(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))


# -- checkpoints without a 'last' pointer (audit D2) -------------------------------------


@pytest.mark.parametrize("resume", [None, "last"])
def test_checkpoints_without_last_are_never_overwritten_or_rotated(tmp_path, resume):
    ckpt = tmp_path / "ckpt"
    fit(ckpt, epochs=3)
    (ckpt / "last").unlink()  # an rsync of *.ckpt, a clean-up by hand
    before = {n: (ckpt / n).read_bytes() for n in names(ckpt)}
    with pytest.raises(CheckpointError, match="no 'last' pointer") as e:
        fit(ckpt, epochs=1, resume=resume, keep=3, seed=1)
    assert "step-000000009.ckpt" in str(e.value) and "resume=" in str(e.value)
    assert {n: (ckpt / n).read_bytes() for n in names(ckpt)} == before


def test_a_users_own_file_named_like_a_checkpoint_is_not_rotated_away(tmp_path):
    ckpt = tmp_path / "ckpt"
    fit(ckpt, epochs=1, keep=2)
    (ckpt / "step-000000001.ckpt").write_bytes(b"mine")  # not the run's (it was rotated)
    fit(ckpt, epochs=3, resume="last", keep=2)
    assert (ckpt / "step-000000001.ckpt").read_bytes() == b"mine"
    assert names(ckpt) == ["step-000000001.ckpt", "step-000000008.ckpt", "step-000000009.ckpt"]
    payload = st.load_checkpoint(ckpt / "step-000000009.ckpt")
    assert payload["checkpoints"] == ["step-000000008.ckpt", "step-000000009.ckpt"]


def test_a_kill_between_the_first_checkpoint_and_its_pointer_still_resumes(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    real = integrity.write_pointer

    def dies(path, name, **kw):
        if name:  # the first checkpoint is on disk; 'last' is not yet renamed onto it
            raise KeyboardInterrupt
        real(path, name, **kw)

    monkeypatch.setattr(integrity, "write_pointer", dies)
    with pytest.raises(KeyboardInterrupt):
        fit(ckpt)
    monkeypatch.setattr(integrity, "write_pointer", real)
    assert names(ckpt) == ["step-000000001.ckpt"]
    assert (ckpt / "last").read_bytes() == b""  # written empty before the first checkpoint
    resumed = fit(ckpt, resume="last")
    assert resumed.losses == fit(tmp_path / "whole").losses


def test_a_kill_between_a_checkpoint_and_its_rotation_leaves_no_file_for_good(
    tmp_path, monkeypatch
):
    ckpt = tmp_path / "ckpt"

    def dying(real):
        def dies(directory, doomed, *rest):
            if doomed:  # the new file and 'last' are written; the oldest is not yet dropped
                raise KeyboardInterrupt
            return real(directory, doomed, *rest)

        return dies

    # (inside a fit, rotation makes one dropped file the spare, then deletes the rest)
    monkeypatch.setattr(ckptspare, "keep", dying(ckptspare.keep))
    monkeypatch.setattr(checkpoint, "remove", dying(checkpoint.remove))
    with pytest.raises(KeyboardInterrupt):
        fit(ckpt, epochs=3, keep=2)
    monkeypatch.undo()
    assert names(ckpt) == [f"step-00000000{i}.ckpt" for i in (1, 2, 3)]
    fit(ckpt, epochs=3, resume="last", keep=2)
    # (before: step-000000001.ckpt stayed, listed by no checkpoint, so never rotated)
    assert names(ckpt) == ["step-000000008.ckpt", "step-000000009.ckpt"]


# -- damaged or odd pointers and files (audit #4) ----------------------------------------


def test_a_pointer_of_binary_bytes_or_a_directory_is_a_checkpoint_error(tmp_path):
    ckpt = tmp_path / "ckpt"
    fit(ckpt)
    (ckpt / "last").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CheckpointError, match="binary bytes.*step-000000006.ckpt"):
        fit(ckpt, resume="last")
    verdicts = {v.path.name: v for v in verify_checkpoints(ckpt)}
    assert verdicts["last"].status == "damaged"
    (ckpt / "last").unlink()
    (ckpt / "last").mkdir()
    with pytest.raises(CheckpointError, match="is a directory"):
        fit(ckpt, resume="last")


def test_garbage_in_last_says_how_to_mend_it_not_to_delete_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    fit(ckpt)
    (ckpt / "last").write_text("../../etc/passwd")
    with pytest.raises(CheckpointError, match="does not name a checkpoint") as e:
        st.Checkpointing(ckpt).last()
    assert "delete" not in str(e.value) and "step-000000006.ckpt" in str(e.value)


def test_a_last_of_nuls_after_a_power_cut_means_the_newest_intact(tmp_path):
    ckpt = tmp_path / "ckpt"
    fit(ckpt)
    (ckpt / "last").write_bytes(b"\0" * 19)
    assert st.Checkpointing(ckpt).last() == ckpt / "step-000000006.ckpt"
    assert not [v for v in verify_checkpoints(ckpt) if v.status == "damaged"]


def test_a_fifo_in_place_of_the_newest_checkpoint_does_not_hang(tmp_path):
    ckpt = tmp_path / "ckpt"
    fit(ckpt)
    newest = ckpt / "step-000000006.ckpt"
    newest.unlink()
    os.mkfifo(newest)
    found: list[object] = []
    reader = threading.Thread(
        target=lambda: found.append(st.Checkpointing(ckpt).last()), daemon=True
    )
    with pytest.warns(UserWarning, match="not a regular file"):
        reader.start()
        reader.join(20)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert found == [ckpt / "step-000000005.ckpt"]
    with pytest.raises(CheckpointError, match="not a regular file"):
        st.load_checkpoint(newest)


def test_what_is_verified_is_what_is_loaded(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    fit(ckpt)
    path, other = ckpt / "step-000000006.ckpt", ckpt / "step-000000002.ckpt"
    real = integrity.verify_open

    def then_swapped(p, f):  # another file is renamed over the path once it is verified
        ok = real(p, f)
        os.replace(other, path)
        return ok

    monkeypatch.setattr(integrity, "verify_open", then_swapped)
    assert st.load_checkpoint(path)["step"] == 6


# -- what resume= and load_checkpoint are given (audit M2) -------------------------------


def test_the_last_pointer_or_the_directory_given_as_a_checkpoint_says_what_to_pass(tmp_path):
    ckpt = tmp_path / "ckpt"
    fit(ckpt)
    with pytest.raises(CheckpointError, match="'last' pointer.*step-000000006.ckpt.*resume='last'"):
        st.load_checkpoint(ckpt / "last")
    with pytest.raises(CheckpointError, match="'last' pointer"):
        fit(tmp_path / "other", resume=ckpt / "last")
    with pytest.raises(CheckpointError, match="is a directory.*resume='last'"):
        fit(tmp_path / "other", resume=str(ckpt))
    with pytest.raises(CheckpointError, match=r"is a directory.*\.last\(\).*\.best_file\(\)"):
        st.load_checkpoint(ckpt)  # for a reader, not a resume: the files to load are named


# -- the directory itself (audit D3, C9) and one writer (audit #5) -----------------------


@pytest.mark.parametrize("bad", [None, 42, True])
def test_a_checkpoint_dir_that_is_no_path_is_refused_at_construction(bad):
    with pytest.raises(TypeError, match="Checkpointing\\(dir\\) takes the path"):
        st.Checkpointing(bad)


def test_an_empty_checkpoint_dir_is_refused_rather_than_the_current_directory():
    with pytest.raises(SettingError, match="empty path"):
        st.Checkpointing("")


@pytest.mark.parametrize(
    ("where", "said"), [("afile", "is a file, not"), ("afile/sub", "lies under a file")]
)
def test_a_checkpoint_dir_that_is_a_file_is_a_clear_error(tmp_path, where, said):
    (tmp_path / "afile").write_text("keep me")
    with pytest.raises(CheckpointError, match=f"{said}.*move the file away"):
        fit(tmp_path / where)
    assert (tmp_path / "afile").read_text() == "keep me"


def test_a_second_fit_into_a_directory_another_fit_writes_is_refused(tmp_path):
    from somatize.torch import ckptdir

    ckpt = tmp_path / "ckpt"
    with ckptdir.writer(ckpt):  # another fit holds it (a lock of another open file)
        with pytest.raises(CheckpointError, match="is in use.*lock"):
            fit(ckpt)
        assert names(ckpt) == []
    assert fit(ckpt).steps == 6  # released when that fit ends
    assert fit(ckpt, epochs=3, resume="last").steps == 9  # and by each fit


def test_dataloader_workers_forked_during_a_fit_do_not_keep_its_directory_locked(tmp_path):
    # Persistent workers outlive the fit; they were forked while it held the lock, and
    # held it on: extending the run (resume="last", more epochs) was refused as in use.
    from torch.utils.data import DataLoader, TensorDataset

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, generator=gen), torch.randint(0, 2, (16,), generator=gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, num_workers=2, persistent_workers=True)

    def run(epochs, resume=None):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=epochs,
            checkpoint=st.Checkpointing(tmp_path / "ckpt"),
            options=st.Options(progress=False),
        ).fit(Graph.somatize(Linear()), loader, resume=resume)

    assert run(1).steps == 4
    with pytest.warns(UserWarning, match="persistent_workers"):  # (not bitwise: said)
        assert run(2, resume="last").steps == 8  # the workers are still alive here


def test_the_directory_lock_is_made_group_writable_in_a_group_shared_directory(tmp_path):
    from somatize.torch import ckptdir

    old = os.umask(0o002)
    try:
        with ckptdir.writer(tmp_path / "ckpt"):
            pass
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "ckpt" / "lock").st_mode & 0o777 == 0o664  # (before: 0o644)


def test_a_directory_in_place_of_a_checkpoint_is_named_as_such_not_a_full_disk(tmp_path):
    ckpt = tmp_path / "ckpt"
    fit(ckpt, epochs=1)
    (ckpt / "step-000000003.ckpt").unlink()
    (ckpt / "step-000000003.ckpt").mkdir()
    with (
        pytest.warns(UserWarning, match="falling back"),
        pytest.raises(CheckpointError, match="a directory is in its place") as e,
    ):
        fit(ckpt, epochs=2, resume="last")
    assert "free space" not in str(e.value)


def test_a_save_lists_its_directory_once_and_sweeps_a_killed_writers_temp_files(
    tmp_path, monkeypatch
):
    from somatize.torch import ckptdir

    ckpt = st.Checkpointing(tmp_path / "ckpt", keep=2)
    payload = {"model": {"w": torch.ones(3)}}  # rotation and the sweep need no full payload
    for step in (1, 2):
        ckpt.save(payload, step)
    left = [".step-000000007.ckpt.99-0.tmp", ".last.99-1.tmp"]  # a killed writer's
    for name in left:
        (ckpt.path / name).write_bytes(b"torn")
    listed = []
    real = os.listdir
    monkeypatch.setattr(ckptdir.os, "listdir", lambda d: listed.append(d) or real(d))
    ckpt.save(payload, 3)
    assert len(listed) == 1  # rotation and the sweep share one listing
    assert sorted(os.listdir(ckpt.path)) == [
        "last",
        "step-000000002.ckpt",
        "step-000000003.ckpt",
    ]
    assert (ckpt.path / "last").read_text() == "step-000000003.ckpt"
    assert integrity.verify_file(ckpt.path / "step-000000003.ckpt")


def test_a_read_only_directory_is_refused_before_a_step_unless_the_run_is_finished(
    tmp_path, monkeypatch
):
    finished = fit(tmp_path, epochs=1)
    # (root writes anywhere, and a test cannot mount a read-only disk: access() says so)
    real = os.access
    read_only = lambda p, mode: mode != os.W_OK and real(p, mode)  # noqa: E731
    monkeypatch.setattr("somatize.torch.policy.os.access", read_only)
    before = names(tmp_path)
    with pytest.raises(CheckpointError, match=r"cannot be written .* has steps left to train"):
        fit(tmp_path, epochs=2, resume="last")  # (it trained until its first save, then failed)
    assert names(tmp_path) == before
    again = fit(tmp_path, epochs=1, resume="last")  # finished: read, nothing to write
    assert again.losses == finished.losses


def test_a_directory_that_cannot_be_made_is_refused_before_a_step(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    real = Path.mkdir

    def read_only(self, *args, **kwargs):  # (a read-only disk: root cannot be refused by mode)
        if self.name == "ckpt":
            raise OSError(errno.EROFS, "Read-only file system")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    steps = []

    class Count:
        def on_event(self, event):
            steps.append(type(event).__name__)

    said = r"ckpt cannot be made \(Read-only file system\), and this run has steps left"
    with pytest.raises(CheckpointError, match=said):
        st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
            checkpoint=st.Checkpointing(tmp_path / "ckpt"),
            watchers=[Count()],
            options=st.Options(progress=False),
        ).fit(Graph.somatize(Linear()), data())
    assert "StepEnd" not in steps  # (it trained until its first save, then failed)
