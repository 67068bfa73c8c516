"""Every code example in docs/ and in the package's docstrings runs as written."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil
import re
import shlex
import signal
import subprocess
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


# Pages whose examples guard a part with `if __name__ == "__main__":` (process pools
# need it): test_docs_examples_run imports the page as a module, which skips that part.
# A ```python not-run example is shown, not run: a guard there does not count.
# quickstart.md has no guard, but what its example prints is checked here too.
MAIN_PAGES = [
    p
    for p in PAGES
    if p.name == "quickstart.md"
    or any(
        'if __name__ == "__main__":' in code for lang, code, _ in examples(p) if lang == "python"
    )
]


@pytest.mark.slow
@pytest.mark.parametrize("page", MAIN_PAGES, ids=[p.name for p in MAIN_PAGES])
def test_main_examples_run_as_a_script(page: Path, tmp_path: Path) -> None:
    """The page's python examples, in order, run as one script (`__main__`, so its
    guarded parts run too) in a child process; each `print(...)  # X` prints X, in order,
    and each ```text block of the page is printed as shown."""
    found = examples(page)
    script = []
    for lang, code, _ in found:
        if lang == "python" and code.startswith("# file: "):
            name = code.split("\n", 1)[0].removeprefix("# file: ").strip()
            (tmp_path / name).write_text(code)
        elif lang == "python":
            script.append(code)
    code = "\n".join(script)
    (tmp_path / "page.py").write_text(code)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path}
    child = subprocess.Popen(
        [sys.executable, "page.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its pool's workers too are stopped with it, below
    )
    try:
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 0, err
    printed = out.splitlines()
    expected = re.findall(r"^[ \t]*print\(.*\)[ \t]+# (.+)$", code, re.M)
    assert [line for line in printed if line in expected] == expected, out
    for shown in re.findall(r"^```text\n(.*?)^```", page.read_text(), re.S | re.M):
        assert shown in out, out


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


def test_the_api_reference_lists_the_methods_of_classes() -> None:
    """Under each class, docs/api.md lists its public methods and properties with their
    signature and docstring (before: none, not even Trainer.fit); an override hides the
    base's, and nn.Module methods a Graph refuses are left out."""
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "tools" / "gen_api.py")
    assert spec is not None and spec.loader is not None
    gen_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_api)
    text = gen_api.render()
    trainer = text[text.index("### `somatize.torch.Trainer`") :]
    trainer = trainer[: trainer.index("\n### ")]
    assert "#### `Trainer.fit`\n\n*method* `Trainer.fit(model: " in trainer
    assert ", *, resume: 'str | os.PathLike[str] | None' = None) -> 'TrainResult'`" in trainer
    assert "Train ``model`` on ``train``" in trainer  # its docstring
    for name in ("evaluate", "predict", "planned_steps"):
        assert f"*method* `Trainer.{name}(" in trainer
    assert "Trainer.validate" not in trainer  # a Lightning name the Trainer refuses
    assert "*classmethod* `Graph.somatize(expr: " in text
    assert "*method* `Graph.cache(" in text
    assert "Graph.to(" not in text and "Graph.parameters(" not in text
    assert "*method* `TrainResult.metric(name: 'str') -> 'float'`" in text
    assert "*property* `Topology.roots: tuple[str, ...]`" in text
    assert "*staticmethod* `JsonLines.read(path: " in text
    assert "Methods and properties: as [`somatize.Transport`](#somatizetransport)." in text


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


def test_the_readme_lists_every_page_the_docs_index_lists() -> None:
    """README.md's Documentation list links each page docs/index.md links (before: it
    left out the quick start and deploy.md)."""
    link = re.compile(r"\]\(([\w\-]+\.md)(?:#[^)]*)?\)")
    index = set(link.findall((ROOT / "docs" / "index.md").read_text()))
    readme = {
        t.removeprefix("docs/")
        for t in re.findall(r"\]\((docs/[\w\-]+\.md)", (ROOT / "README.md").read_text())
    }
    assert index, "docs/index.md links no page"
    assert not index - readme, sorted(index - readme)


def test_every_public_name_is_in_the_user_docs() -> None:
    """Each name of somatize.__all__ and somatize.torch.__all__ is mentioned in README.md
    or a page of docs/ other than the generated api.md."""
    import somatize.torch

    text = "\n".join(
        p.read_text()
        for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
        if p.name != "api.md"
    )
    names = [*somatize.__all__, *somatize.torch.__all__]
    missing = [n for n in names if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text)]
    assert not missing, missing


def test_links_to_sections_resolve() -> None:
    """Every `page.md#section` link of README.md and docs/*.md names a heading of that
    page (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    fence = re.compile(r"^```.*?^```", re.S | re.M)
    anchors = {
        p.resolve(): {
            re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+\s+(.*)$", fence.sub("", p.read_text()), re.M)
        }
        for p in pages
    }
    broken = []
    for page in pages:
        for target, section in re.findall(r"\]\(([^)#\s]*)#([^)\s]*)\)", page.read_text()):
            dest = (page.parent / target).resolve() if target else page.resolve()
            if "://" not in target and dest in anchors and section not in anchors[dest]:
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{section}")
    assert not broken, broken
