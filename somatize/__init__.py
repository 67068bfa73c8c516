"""somatize — a PyTorch-native training framework on a small graph engine.

Compose nodes into a graph (``a >> b``, forks with ``|``), train it with
``somatize.torch``'s Trainer, and run many runs as plain Python over results.
This package is the engine; it imports nothing from torch.
"""

from importlib.metadata import PackageNotFoundError, version

from .catalog import Catalog
from .codecs import Codec, DataCodec
from .errors import (
    AggregationError,
    CacheError,
    CheckpointError,
    CrossingError,
    CycleError,
    DeclarationError,
    DuplicateNodeError,
    EmptyGraphError,
    GraphError,
    KeeperError,
    MissingExtraError,
    MissingNodeError,
    MissingValueError,
    NodeError,
    SomatizeError,
    StateError,
    TransportError,
    ValueConversionError,
    WorkerLostError,
)
from .graph import Graph
from .keepers import DiskKeeper, Keeper, MemoryKeeper, TieredKeeper
from .memory import Memory, key
from .node import Ctx, Done, Mapped, Node, Run
from .pick import Pick
from .placement import Placement
from .plan import Plan, Step
from .topology import Topology
from .transports import Transport
from .values import Opaque, decode, digest, encode
from .watchers import JsonLines, Recorder, Watcher

try:
    __version__ = version("somatize")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

__all__ = [
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
