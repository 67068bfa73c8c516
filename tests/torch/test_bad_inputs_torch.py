"""The bad-input catalogue (somatize.torch): modules, state, checkpoints, level 3, the Trainer.

As ``tests/test_bad_inputs.py``: each bad input raises a ``SomatizeError`` subclass, or
the built-in the API documents, with a message naming the offending value.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, encode
from somatize.errors import (
    AggregationError,
    CheckpointError,
    SettingError,
    SomatizeError,
    StateError,
)
from somatize.errors import ValueConversionError as VCE
from somatize.torch import federated as fl
from somatize.torch.checkpoint import rng_state
from somatize.torch.verify import verify_checkpoints


class Lin(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


class GivesGrad(Node):
    def forward(self, x, ctx):
        return Done(torch.ones(2, requires_grad=True))


def lin() -> Graph:
    return Graph.somatize(Lin())  # the node's id: "lin"


def result(**kw: Any) -> st.TrainResult:
    return st.TrainResult(
        state={"w": torch.zeros(2)}, num_examples=1, steps=1, epochs=1, metrics=[{"val_acc": 0.5}]
    )


def two(*states: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    return list(states)


W = {"w": torch.zeros(2)}


def trainer(**kw: Any) -> st.Trainer:
    kw.setdefault("optimizer", torch.optim.SGD)
    return st.Trainer(**kw)


def fit(tmp: Path, **kw: Any) -> st.TrainResult:
    t = trainer(loss=F.mse_loss, epochs=1, options=st.Options(progress=False))
    return t.fit(lin(), [(torch.zeros(1, 3), torch.zeros(1, 2))], **kw)


def payload(**changes: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "model": {"w": torch.zeros(2)},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": None,
        "step": 2,
        "epoch": 0,
        "position": 2,
        "examples_seen": 2,
        "losses": [1.0, 0.5],
        "metrics": [],
        "best": None,
        "pruned": False,
        "pruner": None,
        "rng": rng_state(),
        "seed": 0,
    }
    for k, v in changes.items():
        if v is KeyError:
            del p[k]
        else:
            p[k] = v
    return p


def saved(tmp: Path, **changes: Any) -> Path:
    """A checksummed checkpoint file holding ``payload(**changes)``."""
    return st.Checkpointing(tmp / "ckpt").save(payload(**changes), 2)


def load(tmp: Path, **changes: Any) -> Any:
    return st.load_checkpoint(saved(tmp, **changes))


def damaged(tmp: Path, how: str) -> Path:
    f = saved(tmp)
    data = bytearray(f.read_bytes())
    if how == "flip":
        data[len(data) // 3] ^= 4
    elif how == "cut":
        del data[-100:]
    else:
        data[-1] ^= 1
    f.write_bytes(bytes(data))
    return f


def text_file(tmp: Path, content: bytes) -> Path:
    f = tmp / "x.ckpt"
    f.write_bytes(content)
    return f


def garbage_last(tmp: Path) -> Any:
    (tmp / "last").write_text("../../etc/passwd")
    return st.Checkpointing(tmp).last()


P = pytest.param
# fmt: off
CASES = [
    # -- module, parameters, state ---------------------------------------------------
    P(lambda t: st.module(42), TypeError, "got int", id="module-int"),
    P(lambda t: st.module(nn.Linear(2, 2)), TypeError, "got Linear", id="module-nn-module"),
    P(lambda t: st.parameters("g"), TypeError, "got str", id="parameters-str"),
    P(lambda t: st.state(42), TypeError, "got int", id="state-int"),
    P(lambda t: st.load_state(lin(), None), StateError, r"not None; pass st\.state", id="load-state-none"),
    P(lambda t: st.load_state(lin(), result()), StateError, r"TrainResult.*result\.state", id="load-state-result"),
    P(lambda t: st.load_state(lin(), [1, 2]), StateError, r"not \[1, 2\]", id="load-state-list"),
    P(lambda t: st.load_state(lin(), {}), StateError, "missing keys: lin.lin.bias", id="load-state-missing"),
    P(lambda t: st.load_state(lin(), {**st.state(lin()), "zz": torch.zeros(1)}), StateError, "unexpected keys: zz", id="load-state-unexpected"),
    P(lambda t: st.load_state(lin(), {k: torch.zeros(7) for k in st.state(lin())}), StateError, r"lin.lin.weight: graph has \(2, 3\), state has \(7,\)", id="load-state-shape"),
    P(lambda t: st.load_state(lin(), dict.fromkeys(st.state(lin()), 1.0)), StateError, "not tensors: lin.lin.bias", id="load-state-not-tensors"),
    P(lambda t: st.load_state(lin(), {**payload(), "model": st.state(lin())}), StateError, r"whole checkpoint .*load_checkpoint\(path\)\['model'\]", id="load-state-whole-checkpoint"),
    P(lambda t: st.load_state(lin(), nn.ModuleDict({"lin": nn.Linear(3, 2)}).state_dict()), StateError, r"lack the graph's node ids .*'lin.bias' is 'lin.lin.bias'", id="load-state-plain-model-names"),
    P(lambda t: st.load_state(lin(), {"module." + k: v for k, v in st.state(lin()).items()}), StateError, r"prefix 'module\.' .*removeprefix\('module\.'\)", id="load-state-ddp-prefix"),
    P(lambda t: st.load_state(lin(), {"_orig_mod." + k: v for k, v in st.state(lin()).items()}), StateError, r"prefix '_orig_mod\.'", id="load-state-compiled-prefix"),
    # -- tensors as data ---------------------------------------------------------------
    P(lambda t: encode(torch.ones(1, requires_grad=True), [st.TensorCodec()]), VCE, r"shape \(1,\) that requires grad", id="tensor-requires-grad"),
    P(lambda t: encode(torch.zeros(2)), VCE, r"torch.Tensor.*codecs of somatize.torch.*st\.module\(g\)", id="tensor-without-codec"),
    P(lambda t: encode(np.zeros(2)), VCE, "numpy.ndarray", id="ndarray-without-codec"),
    P(lambda t: Graph.somatize(GivesGrad(), codecs=[st.TensorCodec()]).forward(1), VCE, r"node 'gives_grad'.*requires grad", id="node-gives-grad-tensor"),
    # -- checkpoints ------------------------------------------------------------------
    P(lambda t: st.Checkpointing("x", keep=0), ValueError, "keep must be .*0", id="checkpointing-keep-0"),
    P(lambda t: st.Checkpointing("x", keep=-3), ValueError, "-3", id="checkpointing-keep-negative"),
    P(lambda t: st.Checkpointing("x", every_steps=0), ValueError, "every_steps must be at least 1, not 0", id="checkpointing-every-0"),
    P(lambda t: st.load_checkpoint(t / "nope.ckpt"), CheckpointError, r"no checkpoint at .*nope\.ckpt", id="load-missing"),
    P(lambda t: st.load_checkpoint(t), CheckpointError, "is a directory", id="load-a-directory"),
    P(lambda t: st.load_checkpoint(text_file(t, b"hello")), CheckpointError, r"x\.ckpt is truncated, corrupt or not a torch checkpoint", id="load-text"),
    P(lambda t: st.load_checkpoint(text_file(t, b"")), CheckpointError, r"x\.ckpt is truncated", id="load-empty"),
    P(lambda t: st.load_checkpoint(damaged(t, "flip")), CheckpointError, r"step-000000002\.ckpt is corrupt: .*blake3", id="load-flipped-bit"),
    P(lambda t: st.load_checkpoint(damaged(t, "cut")), CheckpointError, r"step-000000002\.ckpt is truncated", id="load-cut-short"),
    P(lambda t: st.load_checkpoint(damaged(t, "digest")), CheckpointError, r"step-000000002\.ckpt is corrupt", id="load-damaged-checksum"),
    P(lambda t: load(t, seed=KeyError), CheckpointError, "missing 'seed'", id="payload-no-seed"),
    P(lambda t: load(t, rng=KeyError), CheckpointError, "missing 'rng'", id="payload-no-rng"),
    P(lambda t: load(t, model=KeyError, optimizer=KeyError), CheckpointError, "missing 'model'; missing 'optimizer'", id="payload-no-model"),
    P(lambda t: load(t, step="2"), CheckpointError, "'step' is str '2', not an int", id="payload-step-str"),
    P(lambda t: load(t, step=True), CheckpointError, "'step' is bool True", id="payload-step-bool"),
    P(lambda t: load(t, position=10**6), CheckpointError, "'position'=1000000 is out of range", id="payload-position-huge"),
    P(lambda t: load(t, position=-1), CheckpointError, "'position'=-1 is out of range", id="payload-position-negative"),
    P(lambda t: load(t, epoch=-1), CheckpointError, "'epoch'=-1 is negative", id="payload-epoch-negative"),
    P(lambda t: load(t, losses="x"), CheckpointError, "'losses' is str 'x', not a list", id="payload-losses-str"),
    P(lambda t: load(t, metrics=[1]), CheckpointError, "'metrics' is list", id="payload-metrics-ints"),
    P(lambda t: load(t, model={"w": 1}), CheckpointError, "'model' entry 'w' is not a tensor", id="payload-model-not-tensor"),
    P(lambda t: load(t, optimizer={"lr": 1}), CheckpointError, "'optimizer' lacks 'state'", id="payload-optimizer-foreign"),
    P(lambda t: load(t, rng={"python": 1}), CheckpointError, "'rng' lacks", id="payload-rng-foreign"),
    P(lambda t: load(t, pruned="no"), CheckpointError, "'pruned' is str 'no', not a bool", id="payload-pruned-str"),
    P(lambda t: load(t, best="good"), CheckpointError, "'best' is str 'good'", id="payload-best-str"),
    P(lambda t: garbage_last(t), CheckpointError, r"does not name a checkpoint \('\.\./\.\./etc/passwd'\)", id="last-garbage"),
    P(lambda t: verify_checkpoints(t / "nowhere"), CheckpointError, "nowhere", id="verify-nowhere"),
    P(lambda t: fit(t, resume="last"), CheckpointError, r"resume='last' needs checkpoint=Checkpointing", id="fit-resume-last-without-dir"),
    P(lambda t: fit(t, resume=t / "no.ckpt"), CheckpointError, r"no checkpoint at .*no\.ckpt", id="fit-resume-missing"),
    # -- level 3 ------------------------------------------------------------------------
    P(lambda t: st.fedavg([]), AggregationError, "list of client results is empty", id="fedavg-empty"),
    P(lambda t: st.fedavg(two(W, {"v": torch.zeros(2)}), weights="uniform"), AggregationError, r"client 1 .*missing: \['w'\], unexpected: \['v'\]", id="fedavg-keys"),
    P(lambda t: st.fedavg(two(W, {"w": torch.zeros(3)}), weights="uniform"), AggregationError, r"client 1, key 'w': shape \(3,\)", id="fedavg-shapes"),
    P(lambda t: st.fedavg(two(W, W)), AggregationError, "client 0 .*no num_examples; pass weights=", id="fedavg-no-num-examples"),
    P(lambda t: st.fedavg(two(W, W), weights=[1.0]), AggregationError, "1 weights for 2 clients", id="fedavg-weights-count"),
    P(lambda t: st.fedavg(two(W, W), weights=[1.0, -1.0]), AggregationError, "client 1 has weight -1.0", id="fedavg-weight-negative"),
    P(lambda t: st.fedavg(two(W, W), weights=[0, 0]), AggregationError, "weights sum to 0", id="fedavg-weights-zero"),
    P(lambda t: st.fedavg([42, 43]), TypeError, "client 0 is a int", id="fedavg-not-states"),
    P(lambda t: st.fedavg(two(W, W), weights="uniform", int_buffers="nope"), ValueError, "int_buffers must be .*'nope'", id="fedavg-int-policy"),
    P(lambda t: st.fedavg(two({"w": torch.tensor([float("nan"), 0.0])}, W), weights="uniform"), AggregationError, "client 0.*'w'", id="fedavg-nan"),
    P(lambda t: st.fedmedian([]), AggregationError, "empty", id="fedmedian-empty"),
    P(lambda t: st.accuracy(torch.zeros(8, 2), torch.zeros(7, dtype=torch.long)), ValueError, r"accuracy: the output \(8, 2\) gives one predicted class per row, \(8,\) .* but the target is \(7,\); give logits \(batch, classes\)", id="accuracy-rows-differ"),
    P(lambda t: st.accuracy(torch.zeros(8), torch.zeros(8, dtype=torch.long)), ValueError, r"accuracy: the output \(8,\) .* for one logit per row, measure \(\(output > 0\) == target\)", id="accuracy-one-logit"),
    P(lambda t: st.accuracy(torch.ones(8, 1), torch.zeros(8, dtype=torch.long)), ValueError, r"accuracy: the output \(8, 1\) has one logit per row.*\(\(output.squeeze\(-1\) > 0\) == target\)", id="accuracy-one-logit-column"),  # before: 1.0, every row class 0
    P(lambda t: st.fedavg(two(W, W), weights=[None, 1]), TypeError, r"client 0's weight is None, not a number; weights holds one number per client", id="fedavg-weight-none"),
    P(lambda t: st.fedavg(two(W, W), weights=5), TypeError, r"weights must be .*not 5; give one number per client.*weights=\[120, 80\]", id="fedavg-weights-int"),
    P(lambda t: st.fedavg(two(W, W), exclude=3), TypeError, r"exclude is a list of keys or patterns .*not 3; e\.g\. exclude=\['head\.\*'\]", id="fedavg-exclude-int"),
    P(lambda t: st.trimmed_mean(two(W, W, W), beta="0.1"), ValueError, r"beta must be in \[0, 0\.5\), not '0\.1'", id="trimmed-mean-beta-str"),
    P(lambda t: fl.histogram([0, 1, 1], [[0, 5]]), ValueError, r"client 0's part holds 5, not an index of the 3 labels \(0 to 2\); pass the labels the partition was made from", id="histogram-index-out-of-range"),
    P(lambda t: st.summarize([], "val_acc"), ValueError, "no results to summarize for 'val_acc'", id="summarize-empty"),
    P(lambda t: st.summarize([result()], "val_loss"), KeyError, "no metric 'val_loss'.*val_acc", id="summarize-missing-metric"),
    P(lambda t: st.run_all(42, abs, [1]), TypeError, "not 42", id="run-all-not-an-executor"),
    P(lambda t: st.executor(retries=-1), ValueError, "retries=-1", id="executor-retries"),
    P(lambda t: st.executor(workers=-2), ValueError, "workers=-2", id="executor-workers"),
    # -- the Trainer, as constructed ---------------------------------------------------
    P(lambda t: trainer(optimizer=42), TypeError, "optimizer must be a factory", id="trainer-optimizer-int"),
    P(lambda t: trainer(epochs=0), ValueError, "epochs must be at least 1, not 0", id="trainer-epochs-0"),
    P(lambda t: trainer(epochs=-1), ValueError, "not -1", id="trainer-epochs-negative"),
    P(lambda t: trainer(max_steps=0), ValueError, "max_steps must be at least 1, not 0", id="trainer-max-steps-0"),
    P(lambda t: trainer(micro_batches=0), ValueError, "micro_batches must be at least 1, not 0", id="trainer-micro-batches-0"),
    P(lambda t: trainer(pruner=42), TypeError, r"pruner must have report\(value, step\)", id="trainer-pruner-int"),
    P(lambda t: st.Options(precision="16"), ValueError, "precision must be .*not '16'", id="options-precision"),
    P(lambda t: st.Options(mode="up"), ValueError, r"mode must be .*'min'.*'max'.*not 'up'", id="options-mode"),
    P(lambda t: st.Options(scheduler_every="batch"), ValueError, "not 'batch'", id="options-scheduler-every"),
    P(lambda t: st.Patience("val_loss", mode="up"), ValueError, "not 'up'", id="patience-mode"),
    P(lambda t: trainer(loss=F.mse_loss).fit(42, []), TypeError, "takes a Graph or an nn.Module, got int", id="fit-int"),
    P(lambda t: st.load_checkpoint(None), TypeError, r"load_checkpoint takes the path of a checkpoint file .*not None; e\.g\. st\.load_checkpoint\('runs/", id="load-checkpoint-none"),
    P(lambda t: st.load_checkpoint(3), TypeError, r"load_checkpoint takes the path .*not 3", id="load-checkpoint-int"),
    P(lambda t: trainer(loss=F.mse_loss).evaluate(42, []), TypeError, r"Trainer\.evaluate takes a Graph or an nn\.Module, got int; pass a Graph, st\.module\(g\)", id="evaluate-int"),
    P(lambda t: trainer(loss=F.mse_loss).predict(Lin(), []), TypeError, r"Trainer\.predict takes .*got Lin, a Node; make it a graph first: Graph\.somatize\(node\)", id="predict-node"),
    P(lambda t: trainer(loss=F.mse_loss).fit(Lin() >> Lin(), []), TypeError, r"Trainer\.fit takes .*got Seq, a >> / \| expression; make it a graph first: Graph\.somatize\(a >> b\)", id="fit-expression"),
    P(lambda t: trainer(loss=F.mse_loss).fit(lin(), None), SomatizeError, r"fit\(\)'s train is NoneType, not batches; pass a sequence of batches or a DataLoader", id="fit-train-none"),
    P(lambda t: trainer(loss=F.mse_loss).fit(lin(), "train.csv"), SomatizeError, r"fit\(\)'s train is str, not batches", id="fit-train-str"),
    P(lambda t: trainer(loss=F.mse_loss).evaluate(lin(), None), SomatizeError, r"evaluate\(\)'s data is NoneType, not batches; pass", id="evaluate-none"),
    P(lambda t: st.model_summary(3), TypeError, r"st\.model_summary takes a Graph or an nn\.Module, not 3; e\.g\. print\(st\.model_summary\(g\)\)", id="model-summary-int"),
    P(lambda t: st.CSVLog(None), TypeError, r"CSVLog takes the path of the CSV file to write, not None; e\.g\. st\.CSVLog\('runs/metrics\.csv'\)", id="csvlog-none"),
    P(lambda t: st.TensorBoard(3), TypeError, r"TensorBoard takes the directory to log to, not 3; e\.g\. st\.TensorBoard\('runs/tb'\)", id="tensorboard-int"),
    P(lambda t: st.Progress(3), TypeError, r"Progress takes a text stream to draw on \(with write\), not 3; e\.g\. st\.Progress\(sys\.stdout\)", id="progress-int"),
    P(lambda t: st.Trainer(loss=None).evaluate(lin(), [(torch.zeros(1, 3), torch.zeros(1, 2))]), TypeError, r"the batch is a tuple of 2 .*without loss= the graph gets the whole batch.*pass loss=fn\(output, target\)", id="evaluate-pair-without-loss"),
    P(lambda t: st.Trainer(loss=F.mse_loss).evaluate(lin(), [{"image": torch.zeros(1, 3), "label": torch.zeros(1, 2)}]), TypeError, r"which the Trainer does not split.*Trainer\(split=lambda b: \(b\['image'\], b\['label'\]\)\)", id="evaluate-dict-unsplit"),
    P(lambda t: trainer(loss=F.mse_loss, epochs=1, options=st.Options(progress=False, sanity_val_batches=0)).fit(lin(), [(torch.zeros(1, 3), torch.zeros(1, 2))], val=[(torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1))]), TypeError, r"the batch is a tuple of 3 .*which the Trainer does not split.*\n\(raised evaluating the validation set after step 1\)", id="fit-val-triple-after-training"),
    P(lambda t: trainer(loss=F.mse_loss, epochs=1, options=st.Options(progress=False, monitor="val_clean_loss")).fit(lin(), [(torch.zeros(1, 3), torch.zeros(1, 2))], val={"clean": [{"image": torch.zeros(1, 3), "label": torch.zeros(1, 2)}]}), TypeError, r"which the Trainer does not split.*Trainer\(split=lambda b: \(b\['image'\], b\['label'\]\)\).*\n\(raised by the sanity check before training, which evaluates 2 batches of val set 'clean'", id="fit-val-dict-sanity"),
    P(lambda t: st.Patience(1), SettingError, r"Patience's first argument is the name of the metric to watch, not 1; e\.g\. Patience\(patience=1\)", id="patience-number-as-metric"),
    P(lambda t: trainer(loss=F.mse_loss).predict(lin(), 3), SomatizeError, r"predict\(\)'s data is int, not batches; pass", id="predict-int"),
    P(lambda t: trainer(loss=F.mse_loss, epochs=1).fit(lin(), []), ValueError, "yielded no batches in epoch 0", id="fit-no-batches"),
    P(lambda t: trainer(loss=F.mse_loss).fit(lin().freeze("lin"), [torch.zeros(1, 3)]), ValueError, "nothing to train", id="fit-all-frozen"),
]
# fmt: on


@pytest.mark.parametrize(("bad", "error", "names"), CASES)
def test_a_bad_input_is_a_clear_error_naming_it(
    tmp_path: Path, bad: Callable[[Path], Any], error: type[BaseException], names: str
) -> None:
    with pytest.raises(error, match=names) as info:
        bad(tmp_path)
    if not isinstance(info.value, SomatizeError):  # a built-in only where the API documents one
        assert type(info.value) in (TypeError, ValueError, KeyError), type(info.value)


def test_the_catalogue_holds_over_a_hundred_bad_inputs():
    from tests.test_bad_inputs import CASES as CORE

    assert len(CASES) + len(CORE) >= 100


class Ident(Node):
    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(x)


def test_a_tensor_into_a_graph_without_the_torch_codecs_points_to_st_module() -> None:
    g = Graph.somatize(Ident())
    with pytest.raises(VCE, match=r"call st\.module\(g\) first"):
        g.forward(torch.ones(2))
    st.module(g)  # the fix the message gives
    assert torch.equal(g.forward(torch.ones(2)), torch.ones(2))


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_executor_refuses_a_worker_count_that_is_not_a_positive_int(workers: Any) -> None:
    with pytest.raises(SomatizeError, match=r"st\.executor\(workers=.*at least 1"):
        st.executor(workers=workers)
