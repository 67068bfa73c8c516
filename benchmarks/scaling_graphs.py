"""The graphs ``bench_scaling`` measures — chains and forks of identity or ``nn.Linear``
nodes, built one operator at a time — and the same walk as plain Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from somatize import Done, Node, Opaque


class Identity(Node):
    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(x))


class Join(Node):
    def forward(self, xs: Any, ctx: Any) -> Done:
        return Done(Opaque(xs[0]))


class Lin(Node):
    def __init__(self) -> None:
        import torch

        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.lin(x)))


def expression(shape: str, nodes: list[Any]) -> Any:
    """``n0 >> n1 >> ...`` or ``n0 >> (n1 | ... | n_{N-2}) >> n_{N-1}``, one operator at a time."""
    if shape == "chain":
        e = nodes[0]
        for n in nodes[1:]:
            e = e >> n
        return e
    src, *branches, join = nodes
    fork = branches[0]
    for b in branches[1:]:
        fork = fork | b
    return src >> fork >> join


def make_nodes(shape: str, n: int, kind: type[Node] = Identity) -> list[Any]:
    nodes: list[Any] = [kind() for _ in range(n)]
    if shape == "fork" and kind is Identity:
        nodes[-1] = Join()
    return nodes


def plain_walk(shape: str, n: int) -> Callable[[Any], Any]:
    """The same walk as plain Python: one function call per node."""

    def ident(v: Any) -> Any:
        return v

    def join(vs: Any) -> Any:
        return vs[0]

    fns = [ident] * n
    if shape == "chain":

        def chain(x: Any) -> Any:
            v = x
            for f in fns:
                v = f(v)
            return v

        return chain
    branches = fns[1:-1]

    def fork(x: Any) -> Any:
        h = ident(x)
        return join(tuple([b(h) for b in branches]))

    return fork
