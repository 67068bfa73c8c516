"""The small nodes the distribute() tests share (tests/test_distribute*.py): Inc, Add and
Wrap (which returns its input Opaque)."""

from somatize import Done, Node, Opaque


class Inc(Node):
    def __init__(self, k: int = 1):
        self.k = k

    def forward(self, x, ctx):
        return Done(x + self.k)


class Add(Node):
    def forward(self, xs, ctx):
        return Done(sum(xs))


class Wrap(Node):
    """Returns its input Opaque."""

    def forward(self, x, ctx):
        return Done(Opaque(x))


class Bag(Node):
    """Returns a set: no data, so it cannot leave its host."""

    def forward(self, x, ctx):
        return Done({x})
