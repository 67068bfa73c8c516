"""Every code example in docs/ and in the package's docstrings runs as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

import somatize
from somatize.cli import main

ROOT = Path(somatize.__file__).resolve().parent.parent
# Pages with a test of their own, which runs their examples in subprocesses or checks
# what they print: docs/distributed.md starts clusters; torch.md, trainer.md check output.
OWN_TEST = {"distributed.md", "torch.md", "trainer.md"}
# Pages that are references or tables, not examples.
NO_EXAMPLES = {"api.md", "recipes.md", "benchmarks.md", "faq.md", "index.md"}
PAGES = sorted(
    [p for p in (ROOT / "docs").glob("*.md") if p.name not in OWN_TEST] + [ROOT / "README.md"]
)
MODULES = sorted(
    m.name for m in pkgutil.iter_modules(somatize.__path__, "somatize.") if not m.ispkg
) + sorted(  # the torch layer's docstrings too (importing it is what needs torch)
    m.name for m in pkgutil.iter_modules([str(ROOT / "somatize" / "torch")], "somatize.torch.")
)
# ```python and ```bash fences run (bash: only `somatize ...` lines, through the CLI).
# Any other info string — ```text, ```console, ```python not-run — is shown, not run.
FENCE = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def examples(page: Path) -> list[tuple[str, str, int]]:
    """(language, code, line the code starts on) of each fenced example, in page order."""
    text = page.read_text()
    return [(m[1], m[2], text.count("\n", 0, m.start(2))) for m in FENCE.finditer(text)]


def test_the_docs_exist() -> None:
    assert {p.name for p in PAGES} >= {"concepts.md", "caching.md", "tutorial.md", "README.md"}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
# lightning 2.6 uses torch's LeafSpec, deprecated in torch 2.13: every Lightning fit warns.
@pytest.mark.filterwarnings(
    r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
)
@pytest.mark.filterwarnings("ignore:The '.*' does not have many workers")
# docs/lightning.md resumes a run into the directory it checkpointed to, on purpose.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_docs_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's python examples run in order as one module of the user's own (so the
    engine can read their source); `# file: NAME` examples are written to NAME; the
    `somatize ...` lines of bash examples run through the CLI and must succeed."""
    found = examples(page)
    if page.name in NO_EXAMPLES:
        assert not found, f"{page.name} is listed as having no examples, but has some"
        return
    assert any(lang == "python" for lang, _, _ in found), f"{page.name} has no examples"
    monkeypatch.chdir(tmp_path)  # examples write caches and files in the working directory
    monkeypatch.syspath_prepend(str(tmp_path))
    lines = [""] * page.read_text().count("\n")
    runnable = []
    for lang, code, start in found:
        if lang == "python" and code.startswith("# file: "):
            name = code.split("\n", 1)[0].removeprefix("# file: ").strip()
            (tmp_path / name).write_text(code)
        elif lang == "python":
            lines[start : start + code.count("\n")] = code.splitlines()
            runnable.append((lang, code, start))
        else:
            runnable.append((lang, code, start))
    name = f"docs_{page.stem}"
    source = tmp_path / f"{name}.py"
    source.write_text("\n".join(lines) + "\n")
    module = types.ModuleType(name)
    module.__file__ = str(source)
    monkeypatch.setitem(sys.modules, name, module)
    before = set(sys.modules)
    try:
        for lang, code, start in runnable:
            if lang == "python":
                exec(compile("\n" * start + code, str(source), "exec"), module.__dict__)
                continue
            for line in code.splitlines():
                argv = shlex.split(line, comments=True)
                if argv:
                    assert argv[0] == "somatize", line
                    assert main(argv[1:]) == 0, line
    finally:
        for added in set(sys.modules) - before:  # modules the examples imported from tmp_path
            if str(tmp_path) in str(getattr(sys.modules[added], "__file__", "")):
                del sys.modules[added]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_api_reference_is_current() -> None:
    """docs/api.md is generated from the docstrings: regenerate it after changing them."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_api.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_relative_links_in_the_docs_resolve() -> None:
    """Every relative link of README.md and docs/*.md points at a file that exists."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in link.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
