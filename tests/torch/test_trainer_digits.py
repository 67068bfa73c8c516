"""The digits recipe (``make demo``): real data, a graph, checkpoints, TensorBoard, ≥ 0.95."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import somatize.torch as st

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "digits.py"


@pytest.fixture(scope="module")
def digits():
    spec = importlib.util.spec_from_file_location("digits_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_reaches_its_target_accuracy(digits, tmp_path, capsys):
    assert digits.main(["--out", str(tmp_path), "--seed", "0"]) == 0
    out = capsys.readouterr().out
    accuracy = float(out.split("validation accuracy ")[1].split()[0])
    assert accuracy >= 0.95
    last = st.Checkpointing(tmp_path / "ckpt").last()
    assert st.load_checkpoint(last)["metrics"][-1]["val_acc"] == pytest.approx(accuracy, abs=1e-4)
    best = st.Checkpointing(tmp_path / "ckpt").best_file()  # kept through rotation
    best_acc = float(out.split("(best ")[1].split(")")[0])
    assert best is not None and f"(best: {best})" in out
    assert st.load_checkpoint(best)["metrics"][-1]["val_acc"] == pytest.approx(best_acc, abs=1e-4)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "val/acc", "val/loss", "node/classify/confidence"} <= tags

    # running again starts afresh in the same directory, the first run set aside, not lost;
    # --resume finds the run finished (stopped early by its pruner, which the Trainer says)
    assert digits.main(["--out", str(tmp_path), "--seed", "0"]) == 0
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    previous = tmp_path / "previous"
    assert st.Checkpointing(previous / "ckpt").last().name == last.name
    assert len(list(previous.glob("events.out.tfevents.*"))) == 1
    again = capsys.readouterr().out
    assert f"moved to {previous}" in again
    with pytest.warns(UserWarning, match="stopped early by its pruner"):
        assert digits.main(["--out", str(tmp_path), "--seed", "0", "--resume"]) == 0
    both = again + capsys.readouterr().out
    lines = [ln for ln in both.splitlines() if ln.startswith("digits:")]

    def steps(line):  # "digits: validation accuracy ... after N steps" without the seconds
        return line.split(" steps")[0]

    assert steps(lines[0]) == steps(lines[1]) == steps(out.splitlines()[0])


def test_the_recipe_fails_loudly_below_its_target(digits, tmp_path, capsys):
    assert digits.main(["--out", str(tmp_path), "--epochs", "1"]) == 1
    assert "below 0.95" in capsys.readouterr().err


def test_the_recipe_is_importable_piece_by_piece(digits, tmp_path):
    train, val = digits.load_data(seed=3)
    assert sum(len(x) for x, _ in train) + sum(len(x) for x, _ in val) == 1797
    assert train[0][0].shape == (64, 64) and float(train[0][0].max()) <= 1.0
    g = digits.make_graph(hidden=32)
    assert set(g.nodes()) == {"hidden", "hidden_2", "classify"}
    result = digits.train(seed=1, epochs=2, out=tmp_path, progress=False)
    assert isinstance(result, st.TrainResult) and result.epochs == 2 and result.seed == 1
    assert result.num_examples == sum(len(x) for x, _ in digits.load_data(seed=1)[0])
