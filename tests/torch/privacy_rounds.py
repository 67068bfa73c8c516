"""The states the DP-FedAvg tests share (tests/torch/test_federated_privacy*.py): a round of
clients around GLOBAL, a Linear + BatchNorm round, and DP-FedAvg without noise by hand."""

import torch


def round_of(global_state, scale, clients=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in global_state.items()
        }
        for _ in range(clients)
    ]


GLOBAL = {"w": torch.zeros(100, 50), "b": torch.zeros(50), "count": torch.tensor(4)}


def bn_round(clients=4, seed=0):
    """A Linear + BatchNorm model's global state, and clients that moved every float key
    (the statistics far more than the weights, as a client's data moves them)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    glob = {k: v.clone() for k, v in net.state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    states = []
    for i in range(clients):
        s = {}
        for k, v in glob.items():
            if not v.is_floating_point():
                s[k] = v + 3 + i  # num_batches_tracked
            else:
                scale = 5.0 if k.startswith("1.running") else 0.5
                s[k] = v + scale * torch.randn(v.shape, generator=g)
        states.append(s)
    buffers = [k for k, _ in net.named_buffers()]
    return glob, states, buffers


WEIGHTS = ("0.weight", "0.bias", "1.weight", "1.bias")
STATS = ("1.running_mean", "1.running_var")


def reference(glob, states, keys, clip, per_round):
    """DP-FedAvg without noise, by hand: each update over ``keys`` clipped to ``clip``,
    summed, divided by per_round; and each client's norm."""
    out, norms = {k: glob[k].double().clone() for k in keys}, []
    for s in states:
        d = {k: s[k].double() - glob[k].double() for k in keys}
        norm = float(torch.cat([v.reshape(-1) for v in d.values()]).norm())
        norms.append(norm)
        for k in keys:
            out[k] += d[k] * min(1.0, clip / norm) / per_round
    return {k: v.to(glob[k].dtype) for k, v in out.items()}, norms
