"""The examples of ``docs/torch.md`` run, in order, as one script."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "torch.md"


def test_torch_doc_examples_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 7
    doc = types.ModuleType("somatize_torch_doc")  # importable: dynamo looks the module up
    sys.modules[doc.__name__] = doc
    try:
        exec(compile("\n\n".join(blocks), str(DOC), "exec"), doc.__dict__)
    finally:
        del sys.modules[doc.__name__]
    out = capsys.readouterr().out
    assert "['classify.out.bias', 'classify.out.weight', 'encode.emb.weight']" in out
    assert "shape mismatches: encode.emb.weight" in out
    assert "['bias', 'towers.item.lin.bias', 'towers.item.lin.weight', 'towers.user" in out
