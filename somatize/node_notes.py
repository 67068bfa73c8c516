"""The note a node's error carries: which node raised it, and — for an error a wrong
input makes — what the node received when somatize made that input a tuple (a join's
inputs, or a root's several graph inputs), and — for a root beside other roots given one
input — that ``a >> b | c >> d`` is ``(a >> b) | (c >> d)``, as it is told to a node of
one input in a graph of several roots and several outputs (``d`` there, meant as a join).
Both paths add it (``hot_path.py``, ``keyed.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import CacheError, NodeError

__all__ = ["name_node"]


def name_node(
    e: BaseException,
    label: str,
    impl: Any,
    on_host: str = "",
    inputs: Sequence[str] = (),
    x: Any = None,
    roots: Sequence[str] = (),
    sinks: Sequence[str] = (),
) -> None:
    """Add a note to ``e`` naming the node that raised it (both paths, and a slice on a
    host), unless it is one of ours that names the node already. For an error a wrong
    input makes (a ``TypeError``, an unpacking ``ValueError``...), the note also says what
    the node received when it was a tuple somatize made: a join's ``inputs``, or a root's
    ``x``, the graph's several inputs. A root of several ``roots`` given one input (not
    the tuple of several) is also told how Python groups ``>>`` and ``|``, and so is a
    node of one input failing on it in a graph of several ``roots`` and ``sinks``: the
    shape ``a >> b | c >> d`` leaves, ``d`` written as a join but fed by ``c`` alone."""
    if hasattr(e, "add_note") and not isinstance(e, (NodeError, CacheError)):
        came = _came(inputs, x) if isinstance(e, _INPUT_ERRORS) else ""
        if not inputs and len(roots) > 1 and type(x) is not tuple:
            came += _precedence(label, roots)
        elif (
            len(inputs) == 1 and len(roots) > 1 and len(sinks) > 1 and isinstance(e, _INPUT_ERRORS)
        ):
            came = _one_input(label, inputs[0], roots, sinks)
        e.add_note(f"raised by node {label!r} ({type(impl).__qualname__}){on_host}{came}")


def _precedence(label: str, roots: Sequence[str]) -> str:
    """ "; it is one of the graph's roots ...": ``a >> b | c >> d`` written for
    ``a >> (b | c) >> d`` makes ``c`` a root, fed the graph's input instead of ``a``'s output."""
    return (
        f"; it is one of the graph's {len(roots)} roots ({_names(roots)}), each fed the graph's "
        f"input: if {label!r} should follow another node, mind Python's precedence — "
        "a >> b | c >> d is (a >> b) | (c >> d); write a >> (b | c) >> d"
    )


def _one_input(label: str, source: str, roots: Sequence[str], sinks: Sequence[str]) -> str:
    """ "; its input x was the output of 'c' alone ...": ``a >> b | c >> d`` written for
    ``a >> (b | c) >> d`` feeds ``d`` — a join unpacking a tuple — with ``c``'s output only,
    and leaves ``b`` an output of its own."""
    return (
        f"; its input x was the output of {source!r} alone (a node receives one tuple only "
        f"where several edges enter it), in a graph of {len(roots)} roots ({_names(roots)}) "
        f"and {len(sinks)} outputs ({_names(sinks)}): if {label!r} should join branches, "
        "mind Python's precedence — a >> b | c >> d is (a >> b) | (c >> d), where d follows "
        "c alone; write a >> (b | c) >> d"
    )


def _names(ids: Sequence[str]) -> str:
    return ", ".join(map(repr, ids[:4])) + (", ..." if len(ids) > 4 else "")


_INPUT_ERRORS = (TypeError, ValueError, AttributeError, IndexError)


def _came(inputs: Sequence[str], x: Any) -> str:
    """ "; its input x was ...": a tuple of a join's inputs, or of the graph's inputs at a
    root — several inputs, or a DataLoader batch (inputs, targets) passed whole, a list —
    (a node expecting one tensor, or another number of inputs, fails on it); "" else."""
    if len(inputs) > 1:
        names = ", ".join(map(repr, inputs))
        parts = ", ".join("abcdefgh"[: len(inputs)]) if len(inputs) <= 8 else "..."
        return (
            f"; its input x was one tuple of its {len(inputs)} inputs, from {names} in the "
            f"order their edges were added: unpack it, {parts} = x"
        )
    if not inputs and type(x) is tuple and not x:
        return (
            "; its input x was its graph's input, an empty tuple: the graph was called with "
            "no input — give it one, model(x) or g.forward(x)"
        )
    if not inputs and type(x) in (tuple, list):
        kind = type(x).__name__
        return (
            f"; its input x was its graph's input, a {kind} of {len(x)}: every root receives "
            "the whole input (several inputs, model(a, b), as one tuple): take its part, "
            "x[0] or x[1], or start from Pick(k) — and if it is a DataLoader batch "
            "(inputs, targets), give the graph its inputs alone, batch[0]: a fit splits "
            "each batch (Trainer(split=...)), a call does not"
        )
    return ""
