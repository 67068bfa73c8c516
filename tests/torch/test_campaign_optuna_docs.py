"""docs/campaigns.md's Optuna study on a pool runs as a script, and its trials' reports
reach the study (a Trial sent to a worker would be a copy: no report, no pruning); the
workers prune with the study's pruner (a storage does not keep it: load_study's own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "campaigns.md"


def study_script(tmp_path, pruner=None):
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    first = blocks[0].split("def train_one_seed")[0]  # the page's imports and its Linear node
    study = next(b for b in blocks if "JournalFileBackend(path)" in b)
    if pruner is not None:
        study = study.replace("optuna.pruners.MedianPruner(n_startup_trials=2)", pruner)
        study = study.replace("study.best_params", '"none (all pruned)"')
    check = """
    print(sum(len(t.intermediate_values) for t in study.trials), "reports")
    print(sorted({t.state.name for t in study.trials}))
"""
    (tmp_path / "sweep.py").write_text(first + study + check)


def run_sweep(tmp_path):
    """The page's study, run as a script in ``tmp_path``; it must exit 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "sweep.py"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    return out


def test_the_optuna_study_on_a_pool_reports_every_evaluation_to_the_study(tmp_path):
    pytest.importorskip("optuna")
    study_script(tmp_path)
    out = run_sweep(tmp_path)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("8 trials; best {'lr': ")
    n = int(lines[1].split()[0])
    assert 8 <= n <= 24  # each trial's evaluations (3, fewer if pruned) reached the study


def test_the_workers_prune_with_the_study_pruner_of_the_page(tmp_path):
    # a pruner that prunes every trial at its first report: were the workers' load_study
    # left without it, Optuna's default MedianPruner would complete the first five trials
    pytest.importorskip("optuna")
    study_script(tmp_path, pruner="optuna.pruners.ThresholdPruner(lower=2.0)")
    out = run_sweep(tmp_path)
    lines = out.stdout.splitlines()
    assert lines[1] == "8 reports" and lines[2] == "['PRUNED']", out.stdout
