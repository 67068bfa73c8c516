"""``Opaque``: the third kind of value, passed by identity and never written down."""

from __future__ import annotations

from typing import Any

from .errors import ValueConversionError

__all__ = ["Opaque"]


class Opaque:
    """A value that exists only in this process and this run: passed by identity.

    Wrap a value in ``Opaque`` when returning it from a node (or once, at the graph's
    input) to carry it past the data boundary unchanged — typically a tensor in the
    middle of an autograd graph. The node downstream receives the unwrapped value.
    An Opaque is never hashed, encoded, cached or sent to another host.

    Example:
        >>> Opaque([1, 2]).value
        [1, 2]
    """

    __slots__ = ("value",)
    value: Any

    def __init__(self, value: Any) -> None:
        self.value = value.value if type(value) is Opaque else value

    def __repr__(self) -> str:
        return f"Opaque({type(self.value).__name__})"

    def __reduce__(self) -> Any:
        raise ValueConversionError(
            f"{self!r} cannot be pickled or sent to another process: Opaque values are passed "
            "by identity within one process — return data (or a detached tensor) instead"
        )
