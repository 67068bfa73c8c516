"""trainer.md's SWA pattern: torch's ``AveragedModel`` over ``st.module(g)``, updated by a
watcher at each ``EpochEnd``, holds the equal-weight mean of those epochs' trained weights
(the module the Trainer trains is ``st.module(g)``, and an epoch ends after its steps)."""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch.optim.swa_utils import SWALR, AveragedModel

import somatize.torch as st
from somatize.watchers import EpochEnd
from tests.torch.trainer_helpers import batches, make_graph, quiet


def test_an_averaged_model_updated_at_epoch_ends_holds_the_mean_of_those_epochs_weights():
    g = make_graph()
    model = st.module(g)
    swa = AveragedModel(model)
    seen: list[dict[str, torch.Tensor]] = []

    class Averaging:
        def on_event(self, event):
            if isinstance(event, EpochEnd) and event.epoch >= 2:
                swa.update_parameters(model)
                seen.append({k: v.detach().clone() for k, v in model.named_parameters()})

    result = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=lambda opt: SWALR(opt, swa_lr=0.05, anneal_epochs=2),
        epochs=5,
        watchers=[Averaging()],
        options=quiet(scheduler_every="epoch"),
    ).fit(g, batches(4))
    assert int(swa.n_averaged) == len(seen) == 3
    final = dict(result.state)
    for name, value in seen[-1].items():  # the last epoch's end is the run's end
        assert torch.equal(value, final[name]), name
    assert not torch.equal(seen[0][name], seen[-1][name])  # the weights moved meanwhile
    averaged = dict(swa.module.named_parameters())
    for name in seen[0]:
        mean = torch.stack([s[name] for s in seen]).mean(0)
        torch.testing.assert_close(averaged[name], mean, rtol=1e-6, atol=1e-7)
    st.load_state(g, swa.module.state_dict())  # the graph now holds the average
    torch.testing.assert_close(dict(model.named_parameters())[name], averaged[name])
