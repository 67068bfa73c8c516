"""Shared fixtures: user modules written to a temp dir, a subprocess environment, hypothesis."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

import somatize

# No deadline: a slow shared machine must not fail a property (no timing thresholds).
settings.register_profile("somatize", deadline=None, print_blob=True)
settings.load_profile("somatize")

ROOT = Path(somatize.__file__).resolve().parent.parent


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A worker process a test left running fails the run, and is ended here: CI once hit
    its time limit after every test had passed, the interpreter joining at exit the workers
    of a pool whose thread had died (CPython gh-107219, tests/torch/test_pool_broken.py)."""
    left = multiprocessing.active_children()
    for p in left:
        p.join(10)  # (one being ended right now)
    left = [p for p in left if p.is_alive()]
    if not left:
        return
    for p in left:
        p.kill()
        p.join(10)
    names = ", ".join(f"{p.name} (pid {p.pid})" for p in left)
    print(f"\nworker processes left running by the tests, now killed: {names}", file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """The environment for a child Python that imports this checkout's somatize."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture
def user_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, str], ModuleType]]:
    """Write a module of "the user's own code" to a temp dir and import it.

    Calling it again with the same name rewrites the file and reloads the module.
    Modules are removed from ``sys.modules`` afterwards.
    """
    folder = tmp_path / "usercode"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a same-second edit must not hit a .pyc
    names: list[str] = []

    def write(name: str, source: str) -> ModuleType:
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        if name in sys.modules:
            return importlib.reload(sys.modules[name])
        names.append(name)
        return importlib.import_module(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)
