"""somatize.torch — the graph as an ``nn.Module``, the Trainer, and functions over many runs.

Importing this module imports torch (the core ``somatize`` never does) but not
lightning, tensorboard or dask: those load where they are used.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as e:  # an error naming the extra to install, not a bare "No module named"
    from ..errors import MissingExtraError

    raise MissingExtraError(
        "'torch' is not installed; install it with: pip install 'somatize[torch]'"
        " (or the torch build your machine needs: https://pytorch.org/get-started)"
    ) from e

from .accuracy import accuracy
from .campaign import Summary, executor, summarize
from .carry import Carry
from .checkpoint import Checkpointing, load_checkpoint
from .codecs import NdarrayCodec, TensorCodec
from .compare import Comparison, Difference, compare
from .csvlog import CSVLog
from .federated import Aggregate, fedavg, fedmedian, trimmed_mean
from .lr_find import LRFind
from .model_summary import ModelSummary, model_summary
from .module import GraphModule, module
from .module_reads import parameters
from .progress import Progress
from .pruning import Patience, Pruner, Threshold
from .remember import Remembered, RememberedResult, remember, run_checkpointing
from .result import TrainResult
from .run_all import Runs, run_all
from .state import load_state, state
from .tensorboard import TensorBoard
from .trainer import Options, Trainer

__all__ = [
    "Aggregate",
    "CSVLog",
    "Carry",
    "Checkpointing",
    "Comparison",
    "Difference",
    "GraphModule",
    "LRFind",
    "ModelSummary",
    "NdarrayCodec",
    "Options",
    "Patience",
    "Progress",
    "Pruner",
    "Remembered",
    "RememberedResult",
    "Runs",
    "Summary",
    "TensorBoard",
    "TensorCodec",
    "Threshold",
    "TrainResult",
    "Trainer",
    "accuracy",
    "compare",
    "executor",
    "fedavg",
    "fedmedian",
    "load_checkpoint",
    "load_state",
    "model_summary",
    "module",
    "parameters",
    "remember",
    "run_all",
    "run_checkpointing",
    "state",
    "summarize",
    "trimmed_mean",
]
