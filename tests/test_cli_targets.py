"""``somatize graph`` / ``cache explain`` given a MODULE:ATTR they cannot use (cli._load):
one line naming the target and the fix, exit status 2 — never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from somatize.cli import main

Writer = Callable[[str, str], ModuleType]

FACTORIES = """
from somatize import Done, Graph, Node


class Inc(Node):
    def forward(self, x, ctx):
        return Done(x + 1)


def build(width):
    return Graph.somatize(Inc())


def broken():
    raise KeyError("a bug in the user's own factory")


class Needs:
    def __init__(self, width):
        self.width = width


word = "hello"
node = Inc()
expr = Inc() >> Inc()
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("target", "said"),
    [
        (":build", "':build' is not MODULE:ATTR"),  # (was ValueError: Empty module name)
        (".cli_factories:build", "'.cli_factories:build' is not MODULE:ATTR"),  # (TypeError)
        ("cli_factories:", "'cli_factories:' is not MODULE:ATTR"),
        ("cli_factories:build.", "'cli_factories:build.' is not MODULE:ATTR"),
        ("cli-factories:build", "'cli-factories:build' is not MODULE:ATTR"),
    ],
)
def test_a_target_that_is_not_module_colon_attr_is_named_with_the_form(
    user_module: Writer, capsys: pytest.CaptureFixture[str], target: str, said: str
) -> None:
    user_module("cli_factories", FACTORIES)
    rc, out, err = run(["graph", target], capsys)
    assert rc == 2 and out == ""
    assert err.startswith(f"somatize: the graph {said}") and err.count("\n") == 1
    assert "e.g. recipes.text_pipeline:graph" in err and "current directory" in err


@pytest.mark.parametrize("command", ["graph", "explain"])
def test_a_factory_that_needs_arguments_is_named_with_its_parameters(
    tmp_path: Path, user_module: Writer, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    user_module("cli_factories", FACTORIES)
    argv = (
        ["graph", "cli_factories:build"]
        if command == "graph"
        else [
            "cache",
            "explain",
            "cli_factories:build",
            "cli_factories:word",
            "--dir",
            str(tmp_path),
        ]
    )
    rc, _, err = run(argv, capsys)  # (was a TypeError from cli.py calling build())
    assert rc == 2 and err.count("\n") == 1
    assert "somatize: cannot load cli_factories:build: build(width) takes arguments" in err
    assert "a function taking none" in err


def test_a_class_needing_arguments_is_named_and_an_inputs_fix_says_input(
    tmp_path: Path, user_module: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    user_module("cli_factories", FACTORIES)
    rc, _, err = run(
        ["cache", "explain", "cli_factories:word", "cli_factories:Needs", "--dir", str(tmp_path)],
        capsys,
    )
    assert rc == 2
    assert "cli_factories:word is a str, not a Graph" in err
    assert "cannot load cli_factories:Needs: Needs(width) takes arguments" in err
    assert "returning the input" in err


def test_an_error_inside_the_users_factory_is_not_mistaken_for_its_arguments(
    user_module: Writer,
) -> None:
    user_module("cli_factories", FACTORIES)
    with pytest.raises(KeyError, match="a bug in the user's own factory"):  # their traceback
        main(["graph", "cli_factories:broken"])


def test_the_examples_say_graph_for_a_graph_and_input_for_an_input(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, _, err = run(["cache", "explain", "a", "b"], capsys)
    graph_line, input_line = err.splitlines()
    assert rc == 2
    assert graph_line.startswith("somatize: the graph 'a' is not MODULE:ATTR")
    assert "e.g. recipes.text_pipeline:graph" in graph_line
    assert input_line.startswith("somatize: the input 'b' is not MODULE:ATTR")
    assert ":graph" not in input_line and "e.g. recipes.text_pipeline:batch" in input_line


def test_cache_without_an_action_does_not_call_the_targets_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["cache"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "required: action" in err and "targets" not in err.splitlines()[-1]


@pytest.mark.parametrize(("target", "kind"), [("node", "Inc"), ("expr", "Seq")])
def test_a_node_or_an_expression_named_for_the_graph_is_told_to_build_it(
    target: str, kind: str, user_module: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not called as a factory (a node refuses a call, naming st.module): refused in a line."""
    user_module("cli_factories", FACTORIES)
    rc, _, err = run(["graph", f"cli_factories:{target}"], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert f"cli_factories:{target} is a {kind}, not a Graph; build it there: graph = " in err
