"""somatize.torch — the graph as an ``nn.Module``, the Trainer, and functions over many runs.

Importing this module imports torch (the core ``somatize`` never does) but not
lightning, tensorboard or dask: those load where they are used.
"""

from .codecs import NdarrayCodec, TensorCodec
from .module import GraphModule, load_state, module, parameters, state

__all__ = [
    "GraphModule",
    "NdarrayCodec",
    "TensorCodec",
    "load_state",
    "module",
    "parameters",
    "state",
]
