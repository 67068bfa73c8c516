"""Memos keyed by a node's class (``class_data``, ``ctx_reads``, the forward check, the
explain records) do not keep the classes a sweep makes per run."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import somatize.class_data as class_data
from somatize import Ctx, Done, Graph, Node
from somatize.cache_warnings import ctx_reads


def _made(scale: int) -> type[Node]:
    class Scale(Node):  # a factory's class: a new one per call, as a sweep's per config
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x * scale)

    return Scale


def test_node_classes_made_per_run_are_not_kept(monkeypatch: Any) -> None:
    monkeypatch.setattr(class_data, "_MAX_CLASSES", 4)  # (the memo's bound; 1024 by default)
    made = []
    for i in range(10):
        cls = _made(i)
        g = Graph.somatize(cls().with_id("s"))
        g.cache("s")
        assert g.run(2).value == 2 * i  # keyed (class_data, the explain record), stored
        assert g.run(2).value == 2 * i  # and found
        made.append(weakref.ref(cls))
        del cls, g
    gc.collect()  # (a class is always in cycles of its own: freed by the collector)
    # before: every class was kept for ever by the forward check's set, the class-data
    # memos and the explain records' memo
    assert sum(r() is not None for r in made) <= 4
    assert len(class_data._USER_CLASSES) <= 4


def test_ctx_reads_keeps_no_class() -> None:
    cls = _made(1)
    assert ctx_reads(cls) == frozenset()
    gone = weakref.ref(cls)
    del cls
    gc.collect()
    assert gone() is None
