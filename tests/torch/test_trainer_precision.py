"""fp16 with a gradient scaler: equal to plain PyTorch's autocast + GradScaler loop, checkpointed,
resumed bitwise."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from tests.torch.test_checkpoint_resume import Crash, CrashAt, assert_same, data, graph, trainer


def test_fp16_equals_a_plain_autocast_and_grad_scaler_loop():
    batches = data(4)
    g = graph(0)
    plain = graph(0)
    body, head = plain["body"], plain["head"]
    torch.manual_seed(0)
    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        seed=0,
        options=st.Options(precision="fp16", shuffle=False, progress=False, clip_grad_norm=0.5),
    ).fit(g, batches)

    params = [*body.lin.parameters(), *head.lin.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(0)  # the Trainer seeds the run: the same dropout masks
    body.drop.train()
    losses = []
    for _ in range(2):
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                out = head.lin(body.drop(torch.relu(body.lin(x))))
                loss = F.cross_entropy(out, y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            scaler.step(opt)
            scaler.update()
            losses.append(float(loss.detach().float()))
    assert result.losses == pytest.approx(losses, rel=0, abs=0)
    assert torch.equal(result.state["head.lin.weight"], head.lin.weight.detach())
    assert torch.equal(result.state["body.lin.weight"], body.lin.weight.detach())


def test_fp16_checkpoints_hold_the_scaler_and_resume_bitwise(tmp_path):
    reference = trainer(tmp_path / "ref", precision="fp16").fit(graph(0), data(), val=data(2))
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(7)], precision="fp16").fit(
            graph(0), data(), val=data(2)
        )
    last = st.load_checkpoint(st.Checkpointing(tmp_path / "ckpt").last())
    assert last["scaler"]["scale"] == 65536.0 and last["scaler"]["_growth_tracker"] == 6
    resumed = trainer(tmp_path, precision="fp16").fit(graph(9), data(), val=data(2), resume="last")
    assert_same(resumed, reference)


def test_resuming_an_fp32_checkpoint_in_fp16_is_refused(tmp_path):
    from somatize.errors import CheckpointError

    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(4)]).fit(graph(0), data(), val=data(2))
    with pytest.raises(CheckpointError, match="without one"):
        trainer(tmp_path, precision="fp16").fit(graph(0), data(), val=data(2), resume="last")


def test_resuming_an_fp16_checkpoint_in_fp32_warns_that_its_scaler_is_dropped(tmp_path):
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(4)], precision="fp16").fit(
            graph(0), data(), val=data(2)
        )
    with pytest.warns(UserWarning, match=r"written in fp16 with a gradient scaler, and this run"):
        trainer(tmp_path).fit(graph(0), data(), val=data(2), resume="last")  # (silent before)


def _wide_graph():
    """64 inputs -> 10 logits: a loss near 2.3, where bfloat16 keeps 1/64ths only."""
    from somatize import Done, Graph, Node, Opaque

    class Wide(Node):
        def __init__(self) -> None:
            self.lin = torch.nn.Linear(64, 10)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)), metrics={"mean": self.lin(x).mean()})

    torch.manual_seed(0)
    return Graph.somatize(Wide().with_id("wide"))


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_evaluation_under_autocast_computes_the_loss_there_as_a_plain_loop(precision, dtype):
    gen = torch.Generator().manual_seed(1)
    val = [
        (torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen))
        for n in (7, 7, 5)  # a smaller last batch: weighed by its size
    ]
    g = _wide_graph()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        metrics={"acc": st.accuracy},
        options=st.Options(precision=precision, progress=False),
    )
    got = trainer.evaluate(g, val)

    lin = g["wide"].lin
    sums = {"loss": 0.0, "acc": 0.0, "wide/mean": 0.0}
    outside = 0.0
    with torch.no_grad():
        for x, y in val:
            with torch.autocast("cpu", dtype=dtype):
                out = lin(x)
                loss = F.cross_entropy(out, y)  # float32 here: autocast runs it so
                acc = st.accuracy(out, y)
            assert loss.dtype == torch.float32 and out.dtype == dtype
            sums["loss"] += float(loss) * len(x)
            sums["acc"] += float(acc) * len(x)
            sums["wide/mean"] += float(out.mean()) * len(x)
            outside += float(F.cross_entropy(out, y)) * len(x)  # the old way: a bf16 loss
    want = {k: v / 19 for k, v in sums.items()}
    assert got == pytest.approx(want, rel=1e-12)
    assert abs(got["loss"] - outside / 19) > 1e-4  # the two ways differ here: the test can fail


def test_resuming_with_another_clip_grad_norm_warns(tmp_path):
    with pytest.raises(Crash):
        trainer(tmp_path, watchers=[CrashAt(4)], clip_grad_norm=0.5).fit(
            graph(0), data(), val=data(2)
        )
    with pytest.warns(UserWarning, match=r"clip_grad_norm=0\.5\), this run has clip_grad_norm=No"):
        trainer(tmp_path).fit(graph(0), data(), val=data(2), resume="last")  # (silent before)
