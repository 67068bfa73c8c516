"""Federated experiments as a ``for`` loop: aggregation, partitions, sampling, server
optimizers, FedProx/SCAFFOLD, robust and private aggregation, clients on any executor.

Level 3 has no type of its own: a round is a loop, and every piece here is a
function or a small object with ``state_dict()``; none of them owns the loop::

    from somatize.torch import federated as fl

    parts = fl.dirichlet(labels, clients=100, alpha=0.5, seed=0)    # index lists
    server = fl.FedAdam(lr=1e-2)                                     # state_dict() to resume
    for r in range(rounds):
        chosen = fl.sample(len(parts), fraction=0.1, round=r, seed=0)
        results = fl.map_clients(pool, train_client, [parts[c] for c in chosen],
                                 shared=global_state)                # the state once per worker
        global_state = server.step(global_state, st.fedavg(results))

Files by concern: ``aggregation`` (fedavg), ``robust`` (median, trimmed mean, Krum,
Bulyan), ``clipping`` (norm clipping, for robustness and for DP), ``partitions``, ``sampling``, ``server`` (server optimizers),
``privacy`` (DP-FedAvg), ``regularizers`` (FedProx, SCAFFOLD), ``metrics``,
``clients`` (running a round on an executor), ``keys`` (buffers, and keys kept local).
"""

from .aggregation import Aggregate, fedavg
from .clients import ClientFailure, map_clients
from .clipping import clip
from .keys import batchnorm_keys
from .metrics import weighted_metrics
from .partitions import Histogram, dirichlet, histogram, iid, quantity_skew, shards
from .privacy import DPFedAvg
from .regularizers import control_variate, prox, scaffold, server_variate, variates
from .robust import bulyan, fedmedian, krum, multi_krum, trimmed_mean
from .sampling import sample
from .server import ServerOptimizer
from .server_presets import FedAdagrad, FedAdam, FedAvgM, FedYogi

__all__ = [
    "Aggregate",
    "ClientFailure",
    "DPFedAvg",
    "FedAdagrad",
    "FedAdam",
    "FedAvgM",
    "FedYogi",
    "Histogram",
    "ServerOptimizer",
    "batchnorm_keys",
    "bulyan",
    "clip",
    "control_variate",
    "dirichlet",
    "fedavg",
    "fedmedian",
    "histogram",
    "iid",
    "krum",
    "map_clients",
    "multi_krum",
    "prox",
    "quantity_skew",
    "sample",
    "scaffold",
    "server_variate",
    "shards",
    "trimmed_mean",
    "variates",
    "weighted_metrics",
]
