"""The lightning extra seen from a fresh interpreter: somatize imports without lightning,
a missing lightning names the extra, and the Lightning recipe runs as a script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

L = pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[2]


# -- the optional extra -----------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )


@pytest.mark.slow
def test_importing_somatize_and_somatize_torch_does_not_import_lightning():
    done = _python(
        """
        import sys
        import somatize, somatize.torch
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                        ("lightning", "pytorch_lightning", "lightning_fabric"))
        print(loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_missing_lightning_raises_an_error_naming_the_extra():
    done = _python(
        """
        import sys
        sys.modules["lightning"] = None  # as if the package were not installed
        from somatize.errors import MissingExtraError
        try:
            import somatize.torch.lightning
        except MissingExtraError as e:
            assert isinstance(e, ImportError)
            print(e)
        else:
            raise SystemExit("no MissingExtraError")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "somatize[lightning]" in done.stdout


@pytest.mark.slow
def test_the_recipe_without_lightning_names_the_extra():
    done = _python(
        """
        import sys
        sys.modules["lightning"] = None  # as if the package were not installed
        from somatize.errors import MissingExtraError
        try:
            import recipes.lightning_callbacks
        except MissingExtraError as e:
            print(e)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pip install 'somatize[lightning]'" in done.stdout


@pytest.mark.slow
def test_the_recipe_runs(tmp_path):
    pytest.importorskip("sklearn")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    recipe = ROOT / "recipes" / "lightning_callbacks.py"
    done = subprocess.run(
        [sys.executable, str(recipe), "--epochs", "2", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    best = next(line for line in done.stdout.splitlines() if line.startswith("best val_acc"))
    assert 0.5 < float(best.split()[-1]) <= 1.0  # digits: well above chance (0.1) after 2 epochs
    # the cosine is sized in optimizer steps and stepped at each: it ends at 0 (stepped
    # once per epoch, it would end at 3e-3 * (1 + cos(pi * 2 / 44)) / 2 = 0.00298)
    lr = next(line for line in done.stdout.splitlines() if line.startswith("final lr"))
    assert float(lr.split()[-1]) < 1e-9
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
