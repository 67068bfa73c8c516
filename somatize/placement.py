"""Placement: where each node runs — two independent maps.

* node → host, read when planning: a value moving between hosts becomes an
  explicit crossing step of the plan.
* node → device, read by the node itself through ``ctx.device``; a device never
  changes the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

__all__ = ["LOCAL", "Placement"]

LOCAL = "local"


@dataclass(frozen=True)
class Placement:
    """Hosts and devices of nodes; absent nodes run on ``LOCAL`` with no device set.

    Example:
        >>> p = Placement().place("enc", host="gpu-box", device="cuda")
        >>> p.host("enc"), p.device("enc"), p.host("other")
        ('gpu-box', 'cuda', 'local')
    """

    hosts: Mapping[str, str] = field(default_factory=dict)
    devices: Mapping[str, str] = field(default_factory=dict)

    def host(self, node: str) -> str:
        return self.hosts.get(node, LOCAL)

    def device(self, node: str) -> str | None:
        return self.devices.get(node)

    def place(self, node: str, *, host: str | None = None, device: str | None = None) -> Placement:
        """A new placement with ``node`` moved to ``host`` and/or ``device``."""
        hosts, devices = dict(self.hosts), dict(self.devices)
        if host is not None:
            hosts[node] = host
        if device is not None:
            devices[node] = device
        return replace(self, hosts=hosts, devices=devices)

    @property
    def multi_host(self) -> bool:
        return any(h != LOCAL for h in self.hosts.values())
