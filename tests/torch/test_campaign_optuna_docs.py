"""docs/campaigns.md's Optuna study on a pool runs as a script, and its trials' reports
reach the study (a Trial sent to a worker would be a copy: no report, no pruning)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "campaigns.md"


def test_the_optuna_study_on_a_pool_reports_every_evaluation_to_the_study(tmp_path):
    pytest.importorskip("optuna")
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    first = blocks[0].split("def train_one_seed")[0]  # the page's imports and its Linear node
    study = next(b for b in blocks if "JournalFileBackend" in b)
    check = """
    print(sum(len(t.intermediate_values) for t in study.trials), "reports")
"""
    (tmp_path / "sweep.py").write_text(first + study + check)
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
    lines = out.stdout.splitlines()
    assert lines[0].startswith("8 trials; best {'lr': ")
    n = int(lines[1].split()[0])
    assert 8 <= n <= 24  # each trial's evaluations (3, fewer if pruned) reached the study
