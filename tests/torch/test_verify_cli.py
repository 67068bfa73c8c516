"""``somatize checkpoint verify`` (verify.py): a directory without checkpoints, and the
``last`` pointer judged as ``fit(resume="last")`` judges it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import somatize.torch as st
from somatize.cli import main
from somatize.errors import CheckpointError
from somatize.torch.verify import verify_checkpoints, verify_command
from tests.torch.test_integrity import fit


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ckpt = tmp_path_factory.mktemp("verify") / "ckpt"
    fit(ckpt)
    return ckpt


@pytest.fixture
def ckpt(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "ckpt"))


def test_a_directory_without_checkpoints_is_exit_2_not_zero_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "tb"
    logs.mkdir()
    (logs / "events.out.tfevents.123").write_bytes(b"x")  # a TensorBoard dir, given by mistake
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh = tmp_path / "fresh"  # a run killed before its first checkpoint: an empty 'last'
    fresh.mkdir()
    (fresh / "last").write_bytes(b"")
    for directory in (logs, empty, fresh):
        assert main(["checkpoint", "verify", str(directory)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert err.startswith(f"somatize: no checkpoint in {directory}: it holds no *.ckpt file")
        assert "st.Checkpointing(dir)" in err
        with pytest.raises(CheckpointError, match="no checkpoint in"):
            verify_checkpoints(directory)


def test_checkpoints_without_last_are_reported_as_resume_last_refuses_them(
    ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ckpt / "last").unlink()  # copied without it
    assert verify_command(str(ckpt)) == 1
    out = capsys.readouterr().out
    assert f"missing    {ckpt / 'last'}: " in out
    assert "fit(..., resume='last') refuses the directory" in out
    assert f"echo step-000000006.ckpt > {ckpt / 'last'}" in out  # the newest intact one
    assert out.splitlines()[-1] == "7 checked: 0 damaged, 1 missing, 0 without a checksum"
    (last,) = [v for v in verify_checkpoints(ckpt) if v.path.name == "last"]
    assert last.status == "missing"
    (ckpt / "last").write_text("step-000000006.ckpt")  # the fix the message gives
    assert verify_command(str(ckpt)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "6 checked: 0 damaged, 0 without a checksum"


@pytest.mark.parametrize(
    "last",
    [b"step-000000006.ckpt\n", b"step-000000004.ckpt", b"", b"\0" * 19, None, b"\xff\xfe", b"x"],
)
def test_verify_fails_exactly_where_resume_last_refuses(ckpt: Path, last: bytes | None) -> None:
    if last is None:
        (ckpt / "last").unlink()
    else:
        (ckpt / "last").write_bytes(last)
    try:
        st.Checkpointing(ckpt).last()
        refused = False
    except CheckpointError:
        refused = True
    bad = [v for v in verify_checkpoints(ckpt) if v.status in ("damaged", "missing")]
    assert bool(bad) == refused
    assert verify_command(str(ckpt)) == (1 if refused else 0)


def test_a_checkpoint_of_another_name_needs_no_last(ckpt: Path, tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(ckpt / "step-000000006.ckpt", alone / "model.ckpt")  # not a run's chain
    assert st.Checkpointing(alone).last() is None  # resume='last' starts afresh: not refused
    assert [(v.path.name, v.status) for v in verify_checkpoints(alone)] == [("model.ckpt", "ok")]


def test_file_names_are_printed_with_their_control_characters_escaped(
    ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an outside audit: a checkpoint directory given by someone else could hold
    a file whose name is an escape sequence, which the command printed for the terminal to
    obey."""
    (ckpt / "x\x1b]0;owned\x07.ckpt").write_bytes(b"not a checkpoint")
    assert main(["checkpoint", "verify", str(ckpt)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "damaged    " + str(ckpt / "x\\x1b]0;owned\\x07.ckpt") in out


def test_a_path_with_nothing_there_names_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(
        CheckpointError, match=r"no checkpoint or checkpoint directory at .*; give a"
    ):
        verify_checkpoints(tmp_path / "nothing")


def test_a_checkpoint_of_another_somatize_version_is_intact_not_damaged(
    ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It reads with the version that wrote it: verify says so and names its format, exit 0
    (a damaged file beside it is still damaged, exit 1)."""
    from somatize.torch import integrity

    newest = st.Checkpointing(ckpt).last()
    assert newest is not None
    payload = {**st.load_checkpoint(newest), "format": "somatize.checkpoint/2"}
    integrity.write_checkpoint(newest, payload)  # (checksummed: intact, of a newer format)
    verdict = next(v for v in verify_checkpoints(ckpt) if v.path == newest)
    assert verdict.status == "other" and "written by a newer version" in verdict.detail
    assert main(["checkpoint", "verify", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert f"other      {newest}: " in out and "1 of another somatize version" in out
    assert "names" not in out  # (the 'last' pointer names an intact file: not damaged)
    newest.write_bytes(newest.read_bytes()[:-10])  # now torn
    assert main(["checkpoint", "verify", str(ckpt)]) == 1
    assert f"damaged    {newest}" in capsys.readouterr().out
