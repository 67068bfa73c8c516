"""Every Python example in docs/distributed.md runs, and prints what the page says."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "distributed.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def examples() -> list[tuple[str, str | None]]:
    """(code, the text block printed after it, if the page shows one)."""
    found: list[tuple[str, str | None]] = []
    for lang, body in BLOCK.findall(PAGE.read_text()):
        if lang == "python":
            found.append((body, None))
        elif lang == "text" and found:
            found[-1] = (found[-1][0], body)
    return found


def test_the_page_has_examples():
    assert len(examples()) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs_and_prints_what_the_page_says(index, tmp_path):
    code, shown = examples()[index]
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    expected = re.findall(r"^\s*print\(.*\)  # (.+)$", code, re.M)
    assert [line for line in printed if line in expected] == expected, done.stdout
    if shown is not None:
        assert shown.strip() in done.stdout
