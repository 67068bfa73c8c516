"""Trainer.evaluate() and Trainer.predict() run where fit() would: Options(device=...)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize.errors import SettingError
from tests.torch.trainer_helpers import batches, make_graph, quiet


class Recording(nn.Sequential):
    """Records the devices it is moved to."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        self.moved: list[torch.device] = []

    def to(self, *args, **kwargs):
        self.moved.append(torch.device(args[0] if args else kwargs["device"]))
        return super().to(*args, **kwargs)


# torch.device("cpu", 0) is not the parameters' torch.device("cpu"): a move a CPU-only
# machine can observe, once place() no longer reads cpu:0 as cpu (see test_start.py)
ELSEWHERE = torch.device("cpu", 0)


@pytest.fixture
def elsewhere(monkeypatch):
    monkeypatch.setattr("somatize.torch.start.as_placed", lambda device: device)


@pytest.mark.usefixtures("elsewhere")
@pytest.mark.parametrize("method", ["evaluate", "predict"])
def test_evaluate_and_predict_move_the_model_to_the_options_device(method):
    model = Recording()
    trainer = st.Trainer(loss=F.cross_entropy, options=quiet(device=ELSEWHERE))
    getattr(trainer, method)(model, batches(2))
    assert model.moved == [ELSEWHERE]
    unplaced = Recording()
    getattr(st.Trainer(loss=F.cross_entropy), method)(unplaced, batches(2))
    assert unplaced.moved == []  # without a device: where the parameters are


@pytest.mark.usefixtures("elsewhere")
def test_evaluate_places_the_model_as_fit_does():
    fitted, evaluated = Recording(), Recording()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=quiet(device=ELSEWHERE),
    )
    trainer.fit(fitted, batches(2))
    trainer.evaluate(evaluated, batches(2))
    assert fitted.moved == evaluated.moved == [ELSEWHERE]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("method", ["evaluate", "predict"])
def test_a_cuda_device_without_cuda_is_refused_as_by_fit(method):
    trainer = st.Trainer(loss=F.cross_entropy, options=quiet(device="cuda"))
    with pytest.raises(SettingError, match=r"device 'cuda' asks for CUDA.*device='cpu'"):
        getattr(trainer, method)(make_graph(), batches(1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_evaluate_and_predict_run_on_cuda_when_asked():
    g, data = make_graph(), batches(3)  # the model and the batches on the CPU
    on_cpu = st.Trainer(loss=F.cross_entropy, metrics={"acc": st.accuracy}).evaluate(g, data)
    cuda = st.Trainer(
        loss=F.cross_entropy, metrics={"acc": st.accuracy}, options=quiet(device="cuda")
    )
    on_gpu = cuda.evaluate(g, data)
    assert next(st.module(g).parameters()).device.type == "cuda"
    assert on_gpu["loss"] == pytest.approx(on_cpu["loss"], rel=1e-4)
    assert on_gpu["acc"] == on_cpu["acc"]
    outputs = cuda.predict(g, data)
    assert all(o.device.type == "cuda" for o in outputs) and len(outputs) == 3


@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_a_module_the_caller_compiled_runs_compiled(call):
    # before: the wrapper was unwrapped and its module run eagerly, said nowhere
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    m = st.module(make_graph())
    trainer = st.Trainer(loss=F.cross_entropy, options=quiet())
    data = batches(3)
    eager = getattr(trainer, call)(m, data)
    got = getattr(trainer, call)(torch.compile(m, backend="eager", fullgraph=True), data)
    assert counters["stats"]["calls_captured"] > 0  # traced by dynamo, not run eagerly
    torch.testing.assert_close(got, eager)
    assert m.training  # the mode it was in
