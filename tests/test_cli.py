"""The somatize command: cache stats|verify|gc|ls and graph MODULE:ATTR."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from somatize import DiskKeeper, Graph
from somatize.cli import main
from somatize.values import encode

Writer = Callable[[str, str], ModuleType]


def k(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def store(tmp_path: Path) -> DiskKeeper:
    keeper = DiskKeeper(tmp_path / "cache")
    keeper.put(k(1), encode("a" * 100))  # entries as the engine writes them: encoded values
    keeper.put(k(2), encode("b" * 100), pinned=True)
    keeper.put(k(3), encode("c" * 100))
    keeper.name("best", k(2))
    return keeper


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cache_stats(store: DiskKeeper, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["cache", "stats", "--dir", str(store.path)], capsys)
    assert rc == 0
    assert out.strip() == str(store.stats())
    assert out.startswith("3 entries,") and "1 pinned, 1 name" in out and "1 names" not in out


def test_cache_ls(store: DiskKeeper, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["cache", "ls", "--dir", str(store.path)], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == [k(1), k(2), k(3)]
    assert lines[1].split()[-1] == "best"
    assert int(lines[0].split()[1]) > 100  # size on disk, header included


def test_cache_verify_reports_and_removes_corrupt_entries(
    store: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    file = store.path / "objects" / k(3)[:2] / k(3)
    file.write_bytes(file.read_bytes()[:-5])
    rc, out, _ = run(["cache", "verify", "--dir", str(store.path)], capsys)
    assert rc == 1
    assert f"removed corrupt entry {k(3)}" in out and "1 corrupt entry removed" in out
    rc, out, _ = run(["cache", "verify", "--dir", str(store.path)], capsys)
    assert rc == 0 and out.startswith("0 corrupt entries removed; 2 entries")


def test_cache_gc_keeps_pinned(store: DiskKeeper, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["cache", "gc", "--dir", str(store.path)], capsys)
    assert rc == 2 and "--max-bytes" in err
    rc, out, _ = run(["cache", "gc", "--max-bytes", "0", "--dir", str(store.path)], capsys)
    assert rc == 0 and out.startswith("freed ")
    assert list(store.keys()) == [k(2)]
    assert "bytes; 1 entry, " in out and "1 pinned, 1 name" in out  # counted in the right number


def test_cache_dir_from_environment_and_missing_dir(
    store: DiskKeeper,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOMATIZE_CACHE", str(store.path))
    rc, out, _ = run(["cache", "stats"], capsys)
    assert rc == 0 and out.startswith("3 entries")
    rc, _, err = run(["cache", "stats", "--dir", str(tmp_path / "nope")], capsys)
    assert rc == 2 and "no cache at" in err and "--dir" in err


@pytest.mark.parametrize("action", ["stats", "gc", "explain"])
def test_an_empty_cache_directory_is_a_one_line_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    monkeypatch.setenv("SOMATIZE_CACHE", "")  # set, but empty
    if action == "explain":
        monkeypatch.setattr("somatize.cli._load", lambda target, graph=True: Graph())
    argv = ["cache", action, *(["g:g", "x:x"] if action == "explain" else ["--max-bytes=0"])]
    rc, out, err = run(argv, capsys)  # (before: a ValueError's traceback, exit status 1)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1
    assert "empty path ($SOMATIZE_CACHE is set but empty" in err and "--dir" in err


@pytest.mark.parametrize("action", ["stats", "ls", "verify", "gc"])
def test_cache_commands_never_create_a_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    plain = tmp_path / "photos"
    plain.mkdir()
    (plain / "cat.jpg").write_bytes(b"jpeg")
    rc, out, err = run(["cache", action, "--max-bytes", "0", "--dir", str(plain)], capsys)
    assert rc == 2 and out == ""
    assert f"no cache at {plain}: it is not a cache" in err and "--dir" in err
    assert [p.name for p in plain.iterdir()] == ["cat.jpg"]  # nothing written into it
    rc, _, err = run(["cache", action, "--max-bytes", "0", "--dir", str(tmp_path / "no")], capsys)
    assert rc == 2 and "does not exist" in err and not (tmp_path / "no").exists()


def test_cache_stats_of_a_store_without_packs_creates_none(
    store: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    (store.path / "packs").rmdir()  # a store written before packs existed
    before = sorted(p.relative_to(store.path) for p in store.path.rglob("*"))
    for action in ("stats", "ls", "verify"):
        rc, _, _ = run(["cache", action, "--dir", str(store.path)], capsys)
        assert rc == 0
    assert sorted(p.relative_to(store.path) for p in store.path.rglob("*")) == before


def test_cache_verify_decodes_tensors_and_removes_what_a_codec_cannot_read(
    store: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    from somatize.torch.codecs import default_codecs

    good = encode(torch.arange(6.0).reshape(2, 3), default_codecs())
    store.put(k(4), good)
    store.put_many([(k(5), good), (k(6), good.replace(b"\x02", b"\x07", 1))])  # a bad shape
    store.put(k(7), b"\xff not an encoded value")  # bytes of the user's own: kept
    rc, out, _ = run(["cache", "verify", "--dir", str(store.path)], capsys)
    assert rc == 1
    removed = sorted(line.split()[-1] for line in out.splitlines() if line.startswith("removed"))
    assert removed == [k(6)]
    assert "1 intact entry is not a somatize value" in out
    assert store.get(k(4)) == good and store.get_many([k(5), k(6)]) == [good, None]
    assert store.get(k(7)) == b"\xff not an encoded value"


GRAPH_MODULE = """
    from somatize import Graph, Node, Done

    class Embed(Node):
        def forward(self, x, ctx):
            return Done(x)

    class Head(Node):
        def forward(self, x, ctx):
            return Done(x)

    graph = Graph.somatize(Embed() >> Head()).cache("embed")

    def make():
        return Graph.somatize(Head())

    not_a_graph = 3
"""


def test_graph_text_and_mermaid(user_module: Writer, capsys: pytest.CaptureFixture[str]) -> None:
    user_module("cli_graphs", GRAPH_MODULE)
    rc, out, _ = run(["graph", "cli_graphs:graph"], capsys)
    assert rc == 0
    assert out.splitlines() == [
        "embed  Embed  [cached]  <- input",
        "head   Head             <- embed",
    ]
    rc, out, _ = run(["graph", "cli_graphs:graph", "--format", "mermaid"], capsys)
    assert rc == 0 and out.startswith("flowchart LR") and '[("embed: Embed<br/>cached")]' in out
    rc, out, _ = run(["graph", "cli_graphs:make", "--format", "text"], capsys)
    assert rc == 0 and out.split() == ["head", "Head", "<-", "input"]


def test_graph_errors(user_module: Writer, capsys: pytest.CaptureFixture[str]) -> None:
    user_module("cli_graphs", GRAPH_MODULE)
    rc, _, err = run(["graph", "cli_graphs"], capsys)
    assert rc == 2 and "MODULE:ATTR" in err
    rc, _, err = run(["graph", "cli_graphs:not_a_graph"], capsys)
    assert rc == 2 and "is a int, not a Graph" in err
    rc, _, err = run(["graph", "cli_graphs:missing"], capsys)
    assert rc == 2 and "cannot load cli_graphs:missing" in err
    rc, _, err = run(["graph", "no_such_module_here:g"], capsys)
    assert rc == 2 and "No module named 'no_such_module_here'" in err
    with pytest.raises(SystemExit):
        main(["graph", "cli_graphs:graph", "--format", "svg"])
    capsys.readouterr()


EXPLAIN_MODULE = """
from somatize import Done, Graph, Node


class Embed(Node):
    def __init__(self, dim):
        self.dim = dim

    def forward(self, word, ctx):
        return Done([len(word) * (i + 1) for i in range(self.dim)])


def graph():
    return Graph().node("embed", Embed(DIM)).cache("embed")


DIM = 3
word = "hello"
other = "bye"
"""


def test_cache_explain_says_why_a_graph_misses_against_a_cache(
    tmp_path: Path, user_module: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = user_module("cli_explain", EXPLAIN_MODULE)
    cache = str(tmp_path / "cache")
    rc, out, _ = run(
        ["cache", "explain", "cli_explain:graph", "cli_explain:word", "--dir", cache], capsys
    )
    assert rc == 2  # no cache there yet: nothing is created
    g = mod.graph()
    g.keeper = DiskKeeper(cache)
    g.forward("hello")
    args = ["--dir", cache]
    rc, out, _ = run(["cache", "explain", "cli_explain:graph", "cli_explain:word", *args], capsys)
    assert (rc, out) == (0, "embed: hit\n")
    rc, out, _ = run(["cache", "explain", "cli_explain:graph", "cli_explain:other", *args], capsys)
    assert out == "embed: miss — input changed\n"
    user_module("cli_explain", EXPLAIN_MODULE.replace("DIM = 3", "DIM = 4"))
    rc, out, _ = run(["cache", "explain", "cli_explain:graph", "cli_explain:word", *args], capsys)
    assert "embed: miss" in out and "declaration (constructor arguments)" in out
    rc, _, err = run(["cache", "explain", "cli_explain:graph", *args], capsys)
    assert rc == 2 and "needs GRAPH and INPUT, each MODULE:ATTR (given 1), e.g. " in err
    rc, _, err = run(["cache", "stats", "cli_explain:graph", *args], capsys)
    assert rc == 2 and "takes no MODULE:ATTR arguments (given cli_explain:graph)" in err


@pytest.mark.slow
def test_the_installed_console_script(
    tmp_path: Path, store: DiskKeeper, subprocess_env: dict[str, str]
) -> None:
    script = Path(sys.executable).with_name("somatize")
    if not script.exists():
        pytest.skip("the console script is not installed in this environment (pip install -e .)")
    work = tmp_path / "work"
    work.mkdir()
    (work / "shown.py").write_text(GRAPH_MODULE.replace("\n    ", "\n"))
    out = subprocess.run(
        [str(script), "graph", "shown:graph", "--format", "text"],
        cwd=work,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "embed  Embed  [cached]  <- input"
    out = subprocess.run(
        [str(script), "cache", "stats", "--dir", str(store.path)],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.startswith("3 entries")


def test_cache_verify_keeps_intact_bytes_that_are_not_somatize_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A keeper stores bytes: the caching docs' own put_many example stores raw ones.
    # Their checksums hold, so verify keeps them (it removed every one of them).
    keeper = DiskKeeper(tmp_path / "raw")
    keeper.put_many([(k(i), b"features of example %d" % i) for i in range(1, 11)])
    keeper.put(k(11), b"a loose raw entry")
    rc, out, _ = run(["cache", "verify", "--dir", str(keeper.path)], capsys)
    assert rc == 0
    assert "11 intact entries are not somatize values" in out
    assert "0 corrupt entries removed; 11 entries" in out
    assert DiskKeeper(keeper.path).get(k(3)) == b"features of example 3"


@pytest.mark.parametrize("command", ["cache", "runs"])
def test_gc_refuses_a_negative_max_bytes_and_removes_nothing(
    store: DiskKeeper, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    before = sorted(store.keys())
    with pytest.raises(SystemExit) as exit_:
        main([command, "gc", "--max-bytes", "-5", "--dir", str(store.path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "-5 is below 0" in err
    assert ("running" in err) == (command == "runs")  # (cache gc: nothing runs there)
    assert sorted(store.keys()) == before


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1000", 1000),
        ("500M", 500 * 10**6),
        ("2GB", 2 * 10**9),
        ("1.5 GiB", 3 << 29),
        ("64kib", 1 << 16),
        ("1e3", 1000),
        ("0", 0),
        ("12345678901234567890", 12345678901234567890),
    ],
)
def test_a_size_takes_a_unit_as_the_commands_print_sizes(text: str, expected: int) -> None:
    from somatize.runs_cli import byte_count

    assert byte_count(text) == expected


@pytest.mark.parametrize("command", ["cache", "runs"])
@pytest.mark.parametrize("text", ["1X", "M", "nan", "inf", "1.5.2G", ""])
def test_a_size_that_is_none_says_how_to_write_one(
    store: DiskKeeper, capsys: pytest.CaptureFixture[str], command: str, text: str
) -> None:
    before = sorted(store.keys())
    with pytest.raises(SystemExit) as exit_:
        main([command, "gc", f"--max-bytes={text}", "--dir", str(store.path)])
    assert exit_.value.code == 2
    assert "write e.g. 1000000000, 500M, 2GB or 1.5GiB" in capsys.readouterr().err
    assert sorted(store.keys()) == before


def test_cache_gc_to_a_size_with_a_unit(
    store: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, _ = run(["cache", "gc", "--max-bytes", "1M", "--dir", str(store.path)], capsys)
    assert rc == 0 and sorted(store.keys()) == sorted([k(1), k(2), k(3)])  # all under 1 MB
    rc, _, _ = run(["cache", "gc", "--max-bytes", "0kB", "--dir", str(store.path)], capsys)
    assert rc == 0 and list(store.keys()) == [k(2)]  # (the pinned one stays)


def test_runs_gc_refuses_a_negative_age(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "remembered").mkdir()
    rc, _, err = run(["runs", "gc", "--older-than=-3d", "--dir", str(tmp_path)], capsys)
    assert rc == 2 and "not an age: '-3d'" in err


def test_output_cut_short_by_a_pipe_ends_quietly(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    keeper = DiskKeeper(tmp_path / "many")
    keeper.put_many([(f"{i:064x}", b"x") for i in range(3000)])  # far more than a pipe holds
    cmd = f"{sys.executable} -m somatize.cli cache ls --dir {keeper.path} 2>err | head -1"
    out = subprocess.run(
        cmd, shell=True, cwd=tmp_path, env=subprocess_env, capture_output=True, text=True
    )
    assert out.stdout.startswith(f"{0:064x}")
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err and "BrokenPipe" not in err, err


EMPTY_MODULE = """
    from somatize import Graph

    empty = Graph()
    word = "hello"
"""


def test_an_empty_graph_is_an_error_naming_it_not_a_traceback(
    tmp_path: Path, user_module: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    user_module("cli_empty", EMPTY_MODULE)
    rc, _, err = run(["graph", "cli_empty:empty"], capsys)
    assert rc == 2
    assert "somatize: cannot draw cli_empty:empty: the graph has no nodes; add one" in err
    DiskKeeper(tmp_path / "cache")
    args = [
        "cache",
        "explain",
        "cli_empty:empty",
        "cli_empty:word",
        "--dir",
        str(tmp_path / "cache"),
    ]
    rc, _, err = run(args, capsys)
    assert rc == 2 and "cannot explain cli_empty:empty on cli_empty:word: the graph has no" in err


def test_cache_explain_without_a_cache_names_the_directory_once(
    tmp_path: Path, user_module: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    user_module("cli_explain", EXPLAIN_MODULE)
    cache = str(tmp_path / "nowhere")
    rc, _, err = run(
        ["cache", "explain", "cli_explain:graph", "cli_explain:word", "--dir", cache], capsys
    )
    assert rc == 2 and err.count("no cache at") == 1 and "--dir" in err


def test_cache_gc_without_max_bytes_shows_how_to_give_it(
    store: DiskKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(["cache", "gc", "--dir", str(store.path)], capsys)
    assert rc == 2 and "needs --max-bytes N" in err
    assert "e.g. somatize cache gc --max-bytes 1000000000" in err


@pytest.mark.slow
def test_python_m_somatize_runs_the_command(subprocess_env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "somatize", "cache", "gc"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "needs --max-bytes N" in out.stderr


def test_cache_help_says_what_each_action_does_and_where_dir_defaults_to(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for action, says in [
        ("stats", "entries, bytes, pinned"),
        ("ls", "each entry's key, size on disk"),
        ("verify", "check every entry's checksum"),
        ("gc", "remove the least recently used"),
        ("explain", "GRAPH INPUT"),
    ]:
        assert re.search(rf"^  {action} +{re.escape(says)}", out, re.M), action
    assert "$SOMATIZE_CACHE" in out
