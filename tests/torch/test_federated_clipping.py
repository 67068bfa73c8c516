"""Norm clipping: every update bounded by C — in fp16 and bf16 too — small ones as sent."""

import math

import pytest
import torch

import somatize.torch as st
from somatize.errors import AggregationError
from somatize.torch import federated as fl
from somatize.torch.federated.clipping import clip_update


def test_clip_bounds_every_update_and_keeps_small_ones():
    g = torch.Generator().manual_seed(0)
    global_state = {"a": torch.randn(10, generator=g), "b": torch.randn(3, generator=g)}
    results = [
        st.TrainResult(
            state={k: v + s * torch.randn(v.shape, generator=g) for k, v in global_state.items()},
            num_examples=10 + i,
            steps=1,
            epochs=1,
        )
        for i, s in enumerate([0.01, 1.0, 100.0])
    ]
    clipped = fl.clip(results, global_state, max_norm=1.0)
    norms = []
    for before, after in zip(results, clipped):
        assert after.num_examples == before.num_examples
        d = torch.cat([(after.state[k] - global_state[k]).double() for k in global_state])
        norms.append(float(d.norm()))
    assert max(norms) <= 1.0 + 1e-6 and norms[2] == pytest.approx(1.0, abs=1e-5)
    assert all(torch.equal(clipped[0].state[k], results[0].state[k]) for k in global_state)
    with pytest.raises(ValueError, match="max_norm must be a positive"):
        fl.clip(results, global_state, max_norm=0)
    with pytest.raises(ValueError, match=r"max_norm must be a positive .*not '1'; e\.g\. max_norm"):
        fl.clip(results, global_state, max_norm="1")  # type: ignore[arg-type]


def test_clip_leaves_named_buffers_out_of_the_norm_and_warns_about_unnamed_statistics():
    g = torch.Generator().manual_seed(1)
    glob = {"w": torch.zeros(6), "bn.running_var": torch.ones(3), "bn.count": torch.tensor(2)}
    states = [
        {"w": torch.randn(6, generator=g), "bn.running_var": 1 + 9 * torch.rand(3, generator=g),
         "bn.count": torch.tensor(5)}
        for _ in range(3)
    ]  # fmt: skip
    out = fl.clip(states, glob, max_norm=0.5, buffers=["bn.running_var", "bn.count"])
    for before, after in zip(states, out):
        assert torch.equal(after["bn.running_var"], before["bn.running_var"])  # as sent
        assert torch.equal(after["bn.count"], before["bn.count"])
        w = before["w"].double()
        torch.testing.assert_close(after["w"].double(), w * min(1.0, 0.5 / float(w.norm())),
                                   atol=1e-7, rtol=0)  # fmt: skip
    with pytest.warns(UserWarning, match=r"'bn.running_var'.*clip measures and scales.*buffers="):
        scaled = fl.clip(states, glob, max_norm=0.5)
    d = torch.cat([scaled[0][k].double() - glob[k].double() for k in ("w", "bn.running_var")])
    assert float(d.norm()) == pytest.approx(0.5, rel=1e-6)  # the statistics counted in the norm
    with pytest.raises(AggregationError, match=r"buffers names keys the state does not hold"):
        fl.clip(states, glob, max_norm=0.5, buffers=["running_var"])


def update_norm(state, glob):
    """The L2 norm of state − global, in float64 (what a rounded state carries)."""
    return math.sqrt(sum(float((state[k].double() - glob[k].double()).pow(2).sum()) for k in glob))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_clipped_low_precision_state_stays_within_the_norm(dtype):
    # rounded to nearest, an fp16 update clipped to 0.1 came back 0.1047
    g = torch.Generator().manual_seed(0)
    glob = {"w": (torch.rand(10000, generator=g) + 0.5).to(dtype)}
    states = [
        {"w": (glob["w"].float() + 0.01 * torch.randn(10000, generator=g)).to(dtype)}
        for _ in range(4)
    ]
    for max_norm in (0.1, 0.5):
        for before, after in zip(states, fl.clip(states, glob, max_norm=max_norm)):
            assert after["w"].dtype == dtype
            assert update_norm(after, glob) <= max_norm
            # each coordinate moved toward the global value, never past the scaled update
            full, _ = clip_update(before, glob, max_norm)
            moved = after["w"].double() - glob["w"].double()
            assert bool((moved.abs() <= full["w"].abs()).all())
            assert bool((moved * full["w"] >= 0).all())
            if dtype == torch.float32:  # short of C by under an ulp per coordinate
                assert update_norm(after, glob) == pytest.approx(max_norm, rel=1e-4)


def test_a_one_ulp_bf16_update_is_not_rounded_back_over_the_norm():
    # every weight moved one bf16 ulp (norm 0.78): scaled by 0.64, each move rounds to a
    # whole ulp to nearest, and the "clipped" update was 1.56 × C; the dtype cannot move
    # these weights by less than one ulp, so within C they stay where they were
    glob = {"w": torch.ones(10000, dtype=torch.bfloat16)}
    state = {"w": (glob["w"].float() + 2.0**-7).to(torch.bfloat16)}
    assert update_norm(state, glob) == pytest.approx(0.78125)
    (after,) = fl.clip([state], glob, max_norm=0.5)
    assert update_norm(after, glob) <= 0.5 and torch.equal(after["w"], glob["w"])


def test_the_float64_update_is_within_the_norm_as_float64_computes_it():
    # d · (C / norm) can come out a rounding above C; the update is scaled again if so
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        glob = {"a": torch.randn(7, dtype=torch.float64, generator=g), "b": torch.zeros(3)}
        state = {
            k: v + 10 * torch.randn(v.shape, dtype=v.dtype, generator=g) for k, v in glob.items()
        }
        max_norm = float(torch.rand((), dtype=torch.float64, generator=g)) + 1e-3
        update, norm = clip_update(state, glob, max_norm)
        assert update["b"].dtype == torch.float64 and norm > max_norm
        after = math.sqrt(sum(float(d.pow(2).sum()) for d in update.values()))
        assert after <= max_norm and after == pytest.approx(max_norm, rel=1e-14)


def test_an_update_whose_sum_of_squares_overflows_is_clipped_along_itself_not_to_zeros():
    """A float64 update of 1e200 a coordinate: its squares summed to inf, the scale
    max_norm / inf was 0, and the update was clipped to all zeros (its norm reported inf)."""
    glob = {"w": torch.zeros(3, dtype=torch.float64)}
    huge = {"w": torch.tensor([1e200, -1e200, 0.0], dtype=torch.float64)}
    half = math.sqrt(0.5)
    assert fl.clip([huge], glob, 1.0)[0]["w"].tolist() == pytest.approx([half, -half, 0.0])
    update, norm = clip_update(huge, glob, 2.0)
    assert norm == pytest.approx(math.sqrt(2) * 1e200, rel=1e-15)
    assert update["w"].tolist() == pytest.approx([2 * half, -2 * half, 0.0])
    tiny = {"w": torch.tensor([3e-170, 4e-170, 0.0], dtype=torch.float64)}  # squares underflow
    update, norm = clip_update(tiny, glob, 1e-170)
    assert norm == pytest.approx(5e-170, rel=1e-15)
    assert update["w"].tolist() == pytest.approx([0.6e-170, 0.8e-170, 0.0], rel=1e-12)
    assert clip_update({"w": glob["w"].clone()}, glob, 1.0)[1] == 0.0


def test_dp_fedavg_clips_an_overflowing_update_and_reports_its_norm():
    pytest.importorskip("opacus")
    glob = {"w": torch.zeros(2, dtype=torch.float64)}
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=1, seed=0)
    out = dp.step(glob, [{"w": torch.tensor([3e200, 4e200], dtype=torch.float64)}])
    assert out["w"].tolist() == pytest.approx([0.6, 0.8])
    assert dp.norms == pytest.approx((5e200,))
