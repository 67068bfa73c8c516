"""GPU paths: the cuda device, bf16/fp16 autocast on cuda, the gradient scaler, nccl DDP.

Marked ``gpu``; skipped cleanly without CUDA. ``tools/gpu_check.sh`` runs them on a GPU
machine (``pytest -m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _fit(tmp_path=None, **options):
    from tests.torch.test_checkpoint_resume import data, graph

    torch.manual_seed(0)
    g = graph(0)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        epochs=2,
        metrics={"acc": st.accuracy},
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=3) if tmp_path else None,
        options=st.Options(device="cuda", progress=False, shuffle=False, **options),
    ).fit(g, data(), val=data(2))
    return g, result


def test_training_on_cuda_moves_the_model_and_batches_and_matches_the_cpu():
    g, result = _fit()
    assert next(st.module(g).parameters()).device.type == "cuda"
    assert all(v.device.type == "cpu" for v in result.state.values())  # the result is on CPU
    from tests.torch.test_checkpoint_resume import data, graph

    torch.manual_seed(0)
    cpu = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        epochs=2,
        metrics={"acc": st.accuracy},
        options=st.Options(progress=False, shuffle=False),
    ).fit(graph(0), data(), val=data(2))
    # dropout draws from the cuda generator on cuda: compare the schedule, not the values
    assert len(result.losses) == len(cpu.losses) and result.steps == cpu.steps


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_on_cuda_trains_and_fp16_checkpoints_its_scaler(tmp_path, precision):
    _, result = _fit(tmp_path, precision=precision)
    assert all(v == v for v in result.losses) and result.losses[-1] < result.losses[0] * 1.5
    payload = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    if precision == "fp16":
        assert payload["scaler"]["scale"] > 0
    else:
        assert payload["scaler"] is None
    assert payload["rng"]["cuda"]  # the cuda generators' states


def test_fp16_on_cuda_resumes_bitwise(tmp_path):
    from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer

    ref = trainer(tmp_path / "ref", precision="fp16", device="cuda").fit(
        graph(0), data(), val=data(2)
    )
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(7)], precision="fp16", device="cuda").fit(
            graph(0), data(), val=data(2)
        )
    resumed = trainer(tmp_path, precision="fp16", device="cuda").fit(
        graph(1), data(), val=data(2), resume="last"
    )
    assert_same(resumed, ref)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl DDP needs two GPUs")
def test_nccl_ddp_on_two_gpus(tmp_path):
    from tests.torch.test_ddp import said, torchrun

    assert torchrun(tmp_path) == 0, said(tmp_path)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for name, value in r0["state"].items():
        assert torch.equal(value, r1["state"][name]), name


def test_deterministic_training_on_cuda_repeats_bitwise_and_puts_the_settings_back():
    before = torch.are_deterministic_algorithms_enabled()
    _, first = _fit(deterministic=True)
    _, second = _fit(deterministic=True)
    assert first.losses == second.losses
    assert all(torch.equal(first.state[k], second.state[k]) for k in first.state)
    assert torch.are_deterministic_algorithms_enabled() == before


def test_noise_drawn_on_cuda_before_a_cached_node_is_seen_and_keyed_by_its_output():
    from somatize import Done, Graph, MemoryKeeper, Node, Opaque

    class Jitter(Node):
        def forward(self, x, ctx):
            return Done(x + torch.randn_like(x))  # the cuda generator's offset moves

    class Enc(Node):
        def __init__(self) -> None:
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    g = Graph.somatize(Jitter() >> Enc().with_id("enc"), keeper=MemoryKeeper())
    g.freeze("enc").cache("enc")
    model = st.module(g).to("cuda")
    x = torch.ones(3, 4, device="cuda")
    assert not torch.equal(model(x), model(x))
