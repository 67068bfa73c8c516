"""What a graph remembers and where it runs its nodes: ``freeze``, ``cache``, ``name``,
``pin`` and ``place`` — each checks the node exists, records the setting in the graph's
``Memory`` or ``Placement``, and marks the graph changed (its program is built again)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cache_warnings import warn_writes_input
from .errors import GraphError
from .keepers.pins import unpin

if TYPE_CHECKING:
    from typing_extensions import Self

    from .keepers.pins import PinLog
    from .memory import Memory
    from .placement import Placement

__all__ = ["Settings"]


class Settings:
    """The memory and placement settings of ``Graph`` (a mixin: the graph holds the state)."""

    memory: Memory
    placement: Placement
    keeper: Any
    _pins: PinLog
    catalog: Any

    if TYPE_CHECKING:  # (Graph's own)

        def _require(self, node_id: str) -> None: ...

        def _changed(self) -> None: ...

    def _set(self, memory: Memory) -> Self:
        self.memory = memory
        self._changed()
        return self

    def freeze(self, node_id: str, on: bool = True) -> Self:
        """No gradients, eval mode, fixed state (enforced by ``somatize.torch``)."""
        self._require(node_id)
        return self._set(self.memory.freeze(node_id, on))

    def cache(self, node_id: str, on: bool = True, *, per: str = "batch") -> Self:
        """Memoise the node's outputs in the keeper, by key.

        Args:
            per: ``"batch"`` keys the whole input (data that really repeats);
                ``"example"`` keys each row of a tensor batch (every tensor of a tuple or
                dict batch, along dim 0) by its content, so memory survives a shuffled
                ``DataLoader``: only the rows not seen before are computed. A node cached
                per example must be frozen or declare ``rowwise = True``, and its rows must
                not interact in eval mode (no centring or pooling over the batch): each
                row is served from the batch it was first computed in.
        """
        self._require(node_id)
        if per not in ("batch", "example"):
            raise GraphError(
                f"g.cache({node_id!r}, per={per!r}): per is 'batch' (key the whole input) "
                "or 'example' (key each row of a tensor batch)"
            )
        if on and per == "batch":  # (per example, rows.py sees tensor writes as they run)
            warn_writes_input(node_id, self.catalog[node_id])
        return self._set(self.memory.cache(node_id, on, per_example=per == "example"))

    def name(self, node_id: str, name: str | None) -> Self:
        """Also record the node's output under ``name`` in the keeper (None removes it)."""
        self._require(node_id)
        return self._set(self.memory.name(node_id, name))

    def pin(self, node_id: str, on: bool = True) -> Self:
        """Keep the node's keeper entries through ``gc``; ``on=False`` unpins the entries
        this graph met for it in this process (see ``somatize.keepers.pins``)."""
        self._require(node_id)
        if not on:
            unpin(self.keeper, self._pins.take(node_id))
        return self._set(self.memory.pin(node_id, on))

    def place(self, node_id: str, *, host: str | None = None, device: str | None = None) -> Self:
        """Run the node on ``host`` (shapes the plan) and/or ``device`` (seen as ``ctx.device``)."""
        self._require(node_id)
        if host is not None and (type(host) is not str or not host):
            raise GraphError(
                f"g.place({node_id!r}, host={host!r:.40}): a host is a non-empty str naming where "
                "the node runs, the key of its transport: g.forward(x, transports={host: ...})"
            )
        self.placement = self.placement.place(node_id, host=host, device=device)
        self._changed()
        return self
