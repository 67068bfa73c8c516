"""Rendering: Mermaid and text, with memory marks and nested subgraphs."""

from __future__ import annotations

from typing import Any

from somatize import Ctx, Done, Graph, Node


class Embed(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


class Head(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


def sample() -> Graph:
    inner = Graph.somatize(Head() >> Head()).cache("head")
    g = Graph()
    g.node("enc", Embed()).node("blk", inner).node("out", Head().mapped())
    g.edge("enc", "blk").edge("blk", "out")
    g.freeze("enc").cache("enc").name("out", "final").pin("out")
    return g


def test_text_marks_memory_and_indents_subgraphs() -> None:
    assert sample().to_text() == "\n".join(
        [
            "enc  Embed          [frozen, cached]         <- input",
            "blk  Graph                                   <- enc",
            "    head    Head  [cached]  <- input",
            "    head_2  Head            <- head",
            "out  Head.mapped()  [named 'final', pinned]  <- blk",
        ]
    )


def test_text_shows_hosts_and_devices() -> None:
    g = Graph.somatize(Embed() >> Head()).place("embed", host="box", device="cuda")
    lines = g.to_text().splitlines()
    assert "[@box, on cuda]" in lines[0] and "[@local]" in lines[1]


def test_mermaid_marks_cached_and_frozen_and_nests_subgraphs() -> None:
    text = sample().to_mermaid()
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    enc = next(line for line in lines if "enc: Embed" in line)
    assert '[("enc: Embed<br/>frozen, cached")]' in enc  # cached: a cylinder
    enc_id = enc.strip().split("[")[0]
    assert f"  class {enc_id} frozen" in lines  # frozen: dashed
    assert "  classDef frozen stroke-dasharray: 5 5" in lines
    start = next(i for i, line in enumerate(lines) if "subgraph" in line and "blk: Graph" in line)
    end = lines.index("  end", start)
    nested = lines[start + 1 : end]
    assert any("blk/head: Head" in line and '[("' in line for line in nested)
    assert any("blk/head_2: Head" in line for line in nested)
    assert any("-->" in line for line in nested)  # the inner edge is drawn inside
    blk_id = lines[start].split()[1]
    assert f"  {enc_id} --> {blk_id}" in lines
    assert f"  input --> {enc_id}" in lines
    assert "named #quot;final#quot;" not in text and "named 'final', pinned" in text


def test_mermaid_escapes_labels_and_clusters_hosts() -> None:
    g = Graph().node('say "hi" <b>', Embed()).place('say "hi" <b>', host="gpu-box")
    g.node("local", Head())
    text = g.to_mermaid()
    assert "say #quot;hi#quot; #lt;b#gt;: Embed" in text
    assert '["host: gpu-box"]' in text and '["host: local"]' in text


def test_a_pick_shows_which_input_it_takes() -> None:
    """Found by a two-tower user: both towers' Picks read ``Pick``, telling them apart by
    nothing but their ids."""
    from somatize import Pick

    g = Graph.somatize((Pick(0) >> Embed().with_id("l")) | (Pick("ids", "mask") >> Head()))
    text = g.to_text()
    assert "Pick(0)" in text and "Pick('ids', 'mask')" in text
    assert "Pick(0)" in g.to_mermaid()
