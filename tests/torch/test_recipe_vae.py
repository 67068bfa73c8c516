"""recipes/vae_digits.py: the VAE's terms in the logs, its reconstructions in TensorBoard at
every epoch's step, the best val_recon it reports, and its exit status when the claim fails."""

from __future__ import annotations

import csv

import pytest
import torch

from recipes import vae_digits


@pytest.fixture(autouse=True)
def _threads():
    """main() sets torch to one thread: put the suite's setting back after each test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def images(log_dir, tag):
    """``(step, width, height)`` of each image ``tag`` in ``log_dir``, as tensorboard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={IMAGES: 0})  # 0: keep every one
    events.Reload()
    return [(e.step, e.width, e.height) for e in events.Images(tag)]


def test_the_recipe_logs_its_terms_and_images_and_reports_the_best_val_recon(
    tmp_path, capsys, monkeypatch
):
    runs, train = [], vae_digits.train

    def keep(*args, **kwargs):  # main's own call, its result kept for the test
        runs.append(train(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(vae_digits, "train", keep)
    assert vae_digits.main(["--epochs", "10", "--logdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (result, _), epochs = runs[0], 10

    with open(tmp_path / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(steps) == result.steps and all(float(r["recon"]) > 0 for r in steps)
    assert all(float(r["kl"]) >= 0 for r in steps)  # each step's KL term, a column of its own
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [float(r["val_recon"]) for r in evals] == [m["val_recon"] for m in result.metrics]
    assert len(result.metrics) == epochs and {"val_kl", "val_mse"} <= set(evals[0])

    at = [m["step"] for m in result.metrics]  # each epoch's evaluation, at its last step
    assert images(tmp_path, vae_digits.TAG) == [(s, 40 * vae_digits.SHOWN, 80) for s in at]

    best = min(m["val_recon"] for m in result.metrics)
    assert result.best == best
    assert f"best val_recon {best:.4f} (" in out
    assert f"reloaded: {best:.4f})" in out  # the best checkpoint's weights give it again
    table = [line.split() for line in out.splitlines() if line[:5].strip().isdigit()]
    assert len(table) == epochs  # a row per epoch: its training terms, its evaluation
    for row, recon, kl in zip(table, result.epoch_terms["recon"], result.epoch_terms["kl"]):
        assert (row[1], row[2]) == (f"{recon:.2f}", f"{kl:.2f}")


def test_an_epoch_is_too_little_and_the_recipe_says_so_and_exits_1(tmp_path, capsys):
    assert vae_digits.main(["--epochs", "1", "--logdir", str(tmp_path)]) == 1
    assert "FAILED: best val_recon" in capsys.readouterr().err
    assert vae_digits.main(["--epochs", "1", "--logdir", str(tmp_path)]) == 1  # a second run
    captured = capsys.readouterr()
    assert "FAILED: best val_recon" in captured.err
    assert f"{tmp_path} held a run: moved to {tmp_path / 'previous'}" in captured.out
    assert (tmp_path / "previous" / "ckpt" / "last").exists()  # the run before, kept
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1  # this run's alone


def test_the_grid_puts_each_digit_in_its_frame_row_by_row():
    x = torch.rand(3, 64)
    y = torch.rand(3, 64)
    image = vae_digits.grid([x, y], scale=2)
    assert image.shape == (1, 2 * 10 * 2, 3 * 10 * 2)
    plain = vae_digits.grid([x, y], scale=1)[0]  # (20, 30)
    assert torch.equal(plain[1:9, 11:19], x[1].view(8, 8))  # top row, second digit
    assert torch.equal(plain[11:19, 21:29], y[2].view(8, 8))  # bottom row, third digit
    assert torch.equal(plain[0], torch.full((30,), 0.5)) and plain[10, 5] == 0.5  # the frames
    assert torch.equal(image[0, ::2, ::2], plain)  # enlarged, each pixel a 2x2 block
