"""DP-FedAvg and float buffers (BatchNorm statistics): refused without a policy, and the
'global', 'unprotected_mean' and 'noised' policies."""

import pytest
import torch

from somatize.errors import AggregationError
from somatize.torch import federated as fl
from tests.torch.privacy_rounds import GLOBAL, STATS, WEIGHTS, bn_round, reference

pytest.importorskip("opacus")


def test_float_buffers_are_refused_without_a_policy_naming_the_keys_and_the_choices():
    glob, states, buffers = bn_round()
    for dp in (
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=4),  # found by their names
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=4, buffers=buffers),
    ):
        with pytest.raises(AggregationError) as e:
            dp.step(glob, states)
        msg = str(e.value)
        assert "'1.running_mean', '1.running_var'" in msg
        for choice in ("buffer_policy='global'", "'noised'", "'unprotected_mean'", "GroupNorm"):
            assert choice in msg
        assert dp.rounds == 0 and dp.accountant.history == []  # nothing was spent
    # a float buffer of another name counts once buffers= names it
    plain = {"w": torch.zeros(3), "scale": torch.ones(2)}
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=2, buffers=["scale"])
    with pytest.raises(AggregationError, match=r"\['scale'\] are float buffers"):
        dp.step(plain, [plain, plain])
    # a model without float buffers steps as before, and integer buffers are no reason to refuse
    dp = fl.DPFedAvg(clip=1.0, noise=0.0, clients=10, per_round=2, buffers=["count"])
    out = dp.step(GLOBAL, [GLOBAL, GLOBAL])
    assert torch.equal(out["w"], GLOBAL["w"]) and out["count"].item() == 4


def test_global_policy_keeps_the_servers_buffers_out_of_the_norm_and_the_noise():
    glob, states, buffers = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=0.0, clients=10, per_round=4, buffers=buffers,
                     buffer_policy="global")  # fmt: skip
    out = dp.step(glob, states)
    want, norms = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    for k in WEIGHTS:
        torch.testing.assert_close(out[k], want[k], atol=1e-7, rtol=0)
    assert dp.norms == pytest.approx(norms, rel=1e-12)  # the weights' update only
    for k in (*STATS, "1.num_batches_tracked"):  # named integer buffers too
        assert torch.equal(out[k], glob[k])
    noisy = fl.DPFedAvg(clip=0.5, noise=2.0, clients=10, per_round=4, buffers=buffers,
                        buffer_policy="global", seed=1)  # fmt: skip
    out = noisy.step(glob, states)
    assert all(torch.equal(out[k], glob[k]) for k in STATS)  # no noise on them either
    assert not torch.allclose(out["0.weight"], want["0.weight"], atol=1e-3)  # but on weights


def test_global_policy_keeps_integer_buffers_buffers_did_not_name():
    # the statistics are found by name; their counter must stay the server's too, or the
    # round would publish the largest client's number of batches, which epsilon does not cover
    glob, states, _ = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=0.0, clients=10, per_round=4, buffer_policy="global")
    out = dp.step(glob, states)
    for k in (*STATS, "1.num_batches_tracked"):
        assert torch.equal(out[k], glob[k])
    want, _ = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    for k in WEIGHTS:
        torch.testing.assert_close(out[k], want[k], atol=1e-7, rtol=0)


def test_unprotected_mean_policy_averages_the_buffers_in_the_clear():
    glob, states, buffers = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=3.0, clients=10, per_round=4, buffers=buffers,
                     buffer_policy="unprotected_mean")  # fmt: skip
    out = dp.step(glob, states)
    for k in STATS:  # the plain mean, no noise: what epsilon does not cover
        mean = torch.stack([s[k].double() for s in states]).mean(0).float()
        torch.testing.assert_close(out[k], mean, atol=1e-7, rtol=0)
    _, norms = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    assert dp.norms == pytest.approx(norms, rel=1e-12)
    assert out["1.num_batches_tracked"].item() == glob["1.num_batches_tracked"].item() + 6  # max


def test_noised_policy_treats_the_statistics_as_weights():
    glob, states, _ = bn_round()
    dp = fl.DPFedAvg(clip=0.5, noise=0.0, clients=10, per_round=4, buffer_policy="noised")
    out = dp.step(glob, states)  # found by their names, clipped and noised with the rest
    want, norms = reference(glob, states, WEIGHTS + STATS, clip=0.5, per_round=4)
    assert dp.norms == pytest.approx(norms, rel=1e-12)
    for k in WEIGHTS + STATS:
        torch.testing.assert_close(out[k], want[k], atol=1e-7, rtol=0)
    _, weights_only = reference(glob, states, WEIGHTS, clip=0.5, per_round=4)
    assert min(n - w for n, w in zip(norms, weights_only)) > 1  # the statistics dominate


def test_buffer_arguments_are_checked():
    with pytest.raises(ValueError, match=r"buffer_policy must be 'global', 'noised'.*'keep'"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, buffer_policy="keep")
    with pytest.raises(TypeError, match=r"not the string 'bn.running_mean'; pass \['bn"):
        fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, buffers="bn.running_mean")
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=10, per_round=2, buffers=["bn.running_var"],
                     buffer_policy="global")  # fmt: skip
    with pytest.raises(AggregationError, match=r"buffers names keys the state does not hold"):
        dp.step(GLOBAL, [GLOBAL, GLOBAL])


def test_integer_buffers_keep_the_servers_values_unless_published_in_the_clear():
    # a model without float buffers, and "noised", published the clients' largest counter
    # (num_batches_tracked: the busiest client's number of batches) outside epsilon
    glob = {"w": torch.zeros(4), "steps": torch.tensor(0)}
    states = [{"w": torch.full((4,), 0.1), "steps": torch.tensor(n)} for n in (3, 500)]
    dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=2, seed=0)
    assert dp.step(glob, states)["steps"].item() == 0
    bn, bn_states, buffers = bn_round()
    for policy, want in (("noised", 0), ("global", 0), ("unprotected_mean", 6)):
        dp = fl.DPFedAvg(clip=1.0, noise=1.0, clients=100, per_round=4, seed=0,
                         buffers=buffers, buffer_policy=policy)  # fmt: skip
        count = dp.step(bn, bn_states)["1.num_batches_tracked"]
        assert count.item() == bn["1.num_batches_tracked"].item() + want, policy
