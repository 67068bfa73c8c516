"""Inside a fit, the next save writes over the file rotation dropped — never one in use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import somatize.torch as st
from somatize.errors import CheckpointError
from somatize.torch import ckptdir, ckptspare, integrity


def payload(step, numel=20_000):
    return {"model": {"w": torch.full((numel,), float(step))}, "step": step}


def right(path, step, numel=20_000):
    """``path`` verifies, and holds what ``payload(step)`` wrote."""
    assert integrity.verify_file(path) is True
    got = torch.load(path, weights_only=True)
    return got["step"] == step and torch.equal(
        got["model"]["w"], payload(step, numel)["model"]["w"]
    )


def spares(directory):
    return sorted(n for n in os.listdir(directory) if ckptspare.SPARE.match(n))


def steps(directory):
    return sorted(n for n in os.listdir(directory) if ckptdir.FILE.match(n))


@pytest.fixture
def ckpt(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    if not ckptspare._local(os.stat(directory).st_dev):
        pytest.skip("the temp directory is not on ext2/3/4, XFS or tmpfs: nothing is recycled")
    return st.Checkpointing(directory, keep=2)


def test_a_fits_saves_write_over_the_file_rotation_dropped_and_its_end_deletes_it(ckpt):
    d = ckpt.path
    with ckptdir.writer(d):
        for step in (1, 2, 3):
            ckpt.save(payload(step), step)
        assert steps(d) == ["step-000000002.ckpt", "step-000000003.ckpt"]
        assert spares(d) == [".step-000000001.ckpt.spare.tmp"]
        dropped = os.stat(d / spares(d)[0]).st_ino
        ckpt.save(payload(4, numel=5_000), 4)  # smaller than the file it is written over
        assert os.stat(ckpt.file(4)).st_ino == dropped
        assert right(ckpt.file(4), 4, numel=5_000)
        assert os.path.getsize(ckpt.file(4)) < os.path.getsize(ckpt.file(3))  # cut to length
        assert spares(d) == [".step-000000002.ckpt.spare.tmp"]
        ckpt.save(payload(5), 5)
        assert right(ckpt.file(5), 5) and right(ckpt.file(4), 4, numel=5_000)
        assert (d / "last").read_text() == "step-000000005.ckpt"
        assert ckpt.last() == ckpt.file(5)
    assert sorted(os.listdir(d)) == ["last", "lock", "step-000000004.ckpt", "step-000000005.ckpt"]


def test_outside_a_fit_the_dropped_file_is_deleted(ckpt):
    for step in range(1, 5):
        ckpt.save(payload(step), step)
        assert spares(ckpt.path) == []
    assert steps(ckpt.path) == ["step-000000003.ckpt", "step-000000004.ckpt"]


def test_the_file_last_named_before_the_save_is_never_made_the_spare(ckpt):
    # keep=1: the only file dropped is the one 'last' named; a power cut that kept that
    # 'last' must find it, so it is deleted after the directory fsync, never renamed
    one = st.Checkpointing(ckpt.path, keep=1)
    with ckptdir.writer(ckpt.path):
        for step in (1, 2, 3):
            one.save(payload(step), step)
            assert spares(ckpt.path) == []
        assert steps(ckpt.path) == ["step-000000003.ckpt"]


def test_a_dropped_file_this_process_has_mapped_is_never_written_over(ckpt):
    with ckptdir.writer(ckpt.path):
        ckpt.save(payload(1), 1)
        loaded = torch.load(ckpt.file(1), weights_only=True, mmap=True)  # as load_checkpoint
        ckpt.save(payload(2), 2)
        ckpt.save(payload(3), 3)  # step 1 is dropped: made the spare
        dropped = os.stat(ckpt.path / spares(ckpt.path)[0]).st_ino
        ckpt.save(payload(4), 4)  # the spare is mapped here: deleted, not written over
        assert os.stat(ckpt.file(4)).st_ino != dropped
        assert right(ckpt.file(4), 4)
    assert torch.equal(loaded["model"]["w"], payload(1)["model"]["w"])  # what it read stays


def test_a_dropped_file_another_process_reads_is_never_written_over(ckpt):
    with ckptdir.writer(ckpt.path):
        ckpt.save(payload(1), 1)
        first = ckpt.file(1).read_bytes()
        reader = subprocess.Popen(  # opens step 1, then reads it all once told to
            [
                sys.executable,
                "-c",
                "import sys; f = open(sys.argv[1], 'rb'); print(flush=True); "
                "sys.stdin.readline(); sys.stdout.buffer.write(f.read())",
                str(ckpt.file(1)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert reader.stdout is not None and reader.stdout.readline() == b"\n"
            for step in (2, 3, 4):  # 3 drops step 1 (the spare); 4 would write over it
                ckpt.save(payload(step), step)
            out, _ = reader.communicate(b"\n", timeout=60)
        finally:
            reader.kill()
        assert out == first  # the reader's file was never written over
        assert right(ckpt.file(4), 4)


def test_a_dropped_file_with_another_link_is_never_written_over(ckpt, tmp_path):
    with ckptdir.writer(ckpt.path):
        ckpt.save(payload(1), 1)
        os.link(ckpt.file(1), tmp_path / "kept-by-hand.ckpt")  # (a snapshot by hard link)
        first = ckpt.file(1).read_bytes()
        for step in (2, 3, 4, 5):
            ckpt.save(payload(step), step)
        assert right(ckpt.file(5), 5)
    assert (tmp_path / "kept-by-hand.ckpt").read_bytes() == first


def test_a_file_written_over_that_is_then_cut_or_flipped_is_refused(ckpt):
    with ckptdir.writer(ckpt.path):
        for step in (1, 2, 3, 4):
            ckpt.save(payload(step), step)
        path = ckpt.file(4)
        good = path.read_bytes()
        assert right(path, 4)
        for bad in (
            good[:-1],
            good[: len(good) // 2],
            good[:100] + bytes([good[100] ^ 4]) + good[101:],
        ):
            path.write_bytes(bad)
            with pytest.raises(CheckpointError, match=r"step-000000004\.ckpt"):
                st.load_checkpoint(path)
        path.write_bytes(good)


def test_a_torn_spare_left_by_a_kill_is_never_loaded_and_is_taken_or_swept(ckpt):
    with ckptdir.writer(ckpt.path):
        for step in (1, 2, 3):
            ckpt.save(payload(step), step)
        (spare,) = spares(ckpt.path)
        (ckpt.path / spare).write_bytes(b"torn")  # a kill while the next save wrote over it
        assert ckpt.last() == ckpt.file(3)
        ckpt.save(payload(4), 4)
        assert right(ckpt.file(4), 4) and spare not in os.listdir(ckpt.path)


def test_on_a_file_system_not_known_to_be_local_nothing_is_written_over(ckpt, monkeypatch):
    monkeypatch.setattr(ckptspare, "_local", lambda dev: False)
    with ckptdir.writer(ckpt.path):
        assert not ckptspare.on(ckpt.path)
        for step in range(1, 5):
            ckpt.save(payload(step), step)
            assert spares(ckpt.path) == []
