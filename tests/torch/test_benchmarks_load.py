"""The benchmarks ``make bench`` runs: every one imports and has its ``run``, and a row of
them survives the copy ``run.py`` writes it through (found when a quick run of the
federated benchmark crashed at the end, after all its work, copying a ``Sample``); what a
benchmark leaves in its temp directory goes with its process."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench_path():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("run")
    finally:
        sys.path.remove(str(BENCH))


def test_every_benchmark_imports_and_has_a_run(bench_path):
    for name in bench_path.BENCHMARKS:
        module = importlib.import_module(f"bench_{name}")
        assert callable(module.run), name


def test_a_row_holding_samples_is_written_as_json(bench_path):
    from common import Row, Sample

    row = Row("keys", "a case", Sample(2.0, 1.5), "ms", baseline_value=Sample(1.0, 0.5))
    back = json.loads(json.dumps(row.as_dict()))
    assert back["value"] == 2.0 and back["baseline_value"] == 1.0
    assert Row(**back).value == 2.0


def test_what_a_benchmark_leaves_in_its_temp_directory_goes_with_it(
    bench_path, tmp_path, monkeypatch
):
    # before: mkdtemp of bench_remember (~1 GB a run), bench_memory and bench_checkpoint
    # stayed in /tmp after every make bench
    record = tmp_path / "where.txt"
    (tmp_path / "bench_leaky.py").write_text(
        "import os, tempfile\n"
        "def run(quick):\n"
        "    d = tempfile.mkdtemp(prefix='somatize-bench-')\n"
        "    open(os.path.join(d, 'store'), 'wb').write(b'x' * 1000)\n"
        f"    open({str(record)!r}, 'w').write(d)\n"
        "    return []\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert bench_path.isolated("leaky", True) == ([], [])
    left = Path(record.read_text())
    assert left.name.startswith("somatize-bench-") and not left.exists()
