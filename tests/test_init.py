import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import somatize


def test_public_surface_is_sorted_and_exact():
    assert somatize.__all__ == sorted(somatize.__all__)
    assert somatize.__all__ == [
        "AggregationError",
        "CacheError",
        "Catalog",
        "CheckpointError",
        "Codec",
        "CrossingError",
        "Ctx",
        "CycleError",
        "DataCodec",
        "DeclarationError",
        "DiskKeeper",
        "Done",
        "DuplicateNodeError",
        "EmptyGraphError",
        "Graph",
        "GraphError",
        "JsonLines",
        "Keeper",
        "KeeperError",
        "Mapped",
        "Memory",
        "MemoryKeeper",
        "MissingExtraError",
        "MissingNodeError",
        "MissingValueError",
        "Node",
        "NodeError",
        "Opaque",
        "Pick",
        "Placement",
        "Plan",
        "Recorder",
        "Run",
        "SomatizeError",
        "StateError",
        "Step",
        "TieredKeeper",
        "Topology",
        "Transport",
        "TransportError",
        "ValueConversionError",
        "Watcher",
        "WorkerLostError",
        "decode",
        "digest",
        "encode",
        "key",
    ]
    for name in somatize.__all__:
        assert hasattr(somatize, name), name


def test_the_core_runs_without_torch(tmp_path):
    """somatize (outside somatize.torch) imports and works with torch made unimportable."""
    script = tmp_path / "no_torch.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            sys.modules["torch"] = None  # any `import torch` now raises ImportError
            import somatize
            from somatize import DiskKeeper, Done, Graph, Node, Recorder
            from somatize.cli import main

            class Upper(Node):
                def forward(self, text, ctx):
                    return Done(text.upper())

            g = Graph(keeper=DiskKeeper(sys.argv[1]))
            g.node("up", Upper()).cache("up")
            seen = Recorder()
            g.watchers.append(seen)
            assert g.forward("hi") == "HI" and g.forward("hi") == "HI"
            assert [type(e).__name__ for e in seen.events].count("CacheHit") == 1
            assert main(["cache", "stats", "--dir", sys.argv[1]]) == 0
            print("OK", "torch" in sys.modules and sys.modules["torch"] is not None)
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "OK False"


def test_no_core_module_imports_torch():
    core = Path(somatize.__file__).parent
    for path in core.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            assert not any(n.split(".")[0] in ("torch", "lightning") for n in names), path.name


def test_somatize_torch_without_torch_names_the_extra():
    """docs/quickstart.md: a missing optional dependency raises an error naming the extra;
    torch is one (the `torch` extra), so `import somatize.torch` without it says so."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        from somatize.errors import MissingExtraError
        try:
            import somatize.torch
        except MissingExtraError as e:
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'somatize[torch]'" in out.stdout
