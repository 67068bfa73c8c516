"""Best-K checkpoints: ranked by the monitored metric, never rotated away, reloadable."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError
from somatize.torch.evaluation import rank_checkpoint


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data(n: int = 2):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen))
        for _ in range(n)
    ]


def scripted(values):
    """A metric giving the next of ``values`` at each evaluation (one batch of val data).

    Its hidden state would see the sanity check's call too: the runs here turn it off."""
    it = iter(values)
    return lambda out, y: torch.tensor(next(it))


def fit(tmp_path, scores, *, keep, best, mode="max", every=None):
    torch.manual_seed(0)
    g = Graph.somatize(Linear())
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=len(scores) if every is None else 1,
        metrics={"score": scripted(scores)},
        checkpoint=st.Checkpointing(tmp_path / "ckpt", keep=keep, best=best),
        options=st.Options(
            progress=False,
            monitor="val_score",
            mode=mode,
            eval_every_steps=every,
            sanity_val_batches=0,
        ),
    )
    return g, trainer, trainer.fit(g, data(2 if every is None else len(scores)), val=data(1))


def names(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))


def test_the_best_checkpoints_survive_rotation(tmp_path):
    # one evaluation per epoch of 2 steps: scores at steps 2, 4, 6, 8, 10
    g, _, result = fit(tmp_path, [0.5, 0.9, 0.3, 0.7, 0.2], keep=1, best=2)
    assert names(tmp_path / "ckpt") == [
        "step-000000004.ckpt",  # 0.9, the best
        "step-000000008.ckpt",  # 0.7, second
        "step-000000010.ckpt",  # the newest, kept by keep=1
    ]
    assert result.best == pytest.approx(0.9)
    assert result.best_checkpoint == str(tmp_path / "ckpt" / "step-000000004.ckpt")
    assert (tmp_path / "ckpt" / "best").read_text() == "step-000000004.ckpt"
    assert (
        st.Checkpointing(tmp_path / "ckpt").best_file() == tmp_path / "ckpt" / "step-000000004.ckpt"
    )
    # the documented one-liner loads the best weights for inference
    payload = st.load_checkpoint(result.best_checkpoint)
    st.load_state(g, payload["model"])
    assert payload["step"] == 4
    assert all(torch.equal(v, payload["model"][k]) for k, v in st.state(g).items())
    assert not all(torch.equal(v, result.state[k]) for k, v in st.state(g).items())


def test_an_evaluation_between_checkpoints_that_ranks_is_checkpointed_at_once(tmp_path):
    _, _, result = fit(tmp_path, [0.1, 0.8, 0.2, 0.3], keep=1, best=1, every=1)
    assert names(tmp_path / "ckpt") == ["step-000000002.ckpt", "step-000000004.ckpt"]
    assert result.best_checkpoint.endswith("step-000000002.ckpt")
    assert st.load_checkpoint(result.best_checkpoint)["metrics"][-1]["val_score"] == pytest.approx(
        0.8
    )


def test_mode_min_and_no_best_without_best(tmp_path):
    _, _, result = fit(tmp_path / "a", [0.5, 0.1, 0.3], keep=1, best=1, mode="min")
    assert result.best_checkpoint.endswith("step-000000004.ckpt")
    _, _, result = fit(tmp_path / "b", [0.5, 0.1, 0.3], keep=1, best=0, mode="min")
    assert result.best_checkpoint is None
    assert names(tmp_path / "b" / "ckpt") == ["step-000000006.ckpt"]


def test_resume_keeps_ranking_the_best(tmp_path):
    directory = tmp_path / "ckpt"

    def trainer(epochs, scores):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=epochs,
            metrics={"score": scripted(scores)},
            checkpoint=st.Checkpointing(directory, keep=1, best=1),
            options=st.Options(
                progress=False, monitor="val_score", mode="max", sanity_val_batches=0
            ),
        )

    torch.manual_seed(0)
    g = Graph.somatize(Linear())
    trainer(2, [0.9, 0.1]).fit(g, data(), val=data(1))
    result = trainer(3, [0.5]).fit(g, data(), val=data(1), resume="last")
    assert result.best_checkpoint.endswith("step-000000002.ckpt")
    assert names(directory) == ["step-000000002.ckpt", "step-000000006.ckpt"]


def test_rank_checkpoint_ties_keep_the_earlier():
    ranked: list[list[float]] = []
    assert rank_checkpoint(ranked, 1.0, 1, 2, "min")
    assert rank_checkpoint(ranked, 1.0, 2, 2, "min")
    assert not rank_checkpoint(ranked, 1.0, 3, 2, "min")
    assert rank_checkpoint(ranked, 0.5, 4, 2, "min")
    assert ranked == [[0.5, 4], [1.0, 1]]


def test_bad_best_is_refused():
    with pytest.raises(ValueError, match="Checkpointing best must be at least 0"):
        st.Checkpointing("x", best=-1)


def best_trainer(tmp_path, monitor, **kwargs):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"score": lambda out, y: torch.tensor(0.5)},
        checkpoint=st.Checkpointing(tmp_path / "ckpt", keep=1, best=1),
        options=st.Options(
            progress=False, monitor=monitor, mode="min" if "loss" in monitor else "max"
        ),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("monitor", "match"),
    [
        ("val_scor", r"monitor='val_scor'.* evaluates val_loss, val_score"),
        ("loss", r"monitor='loss'.*did you mean 'val_loss'\?"),
        ("score", r"monitor='score'.*did you mean 'val_score'\?"),
    ],
)
def test_a_monitor_that_is_not_evaluated_is_refused_before_training(tmp_path, monitor, match):
    trainer = best_trainer(tmp_path, monitor)
    with pytest.raises(KeyError, match=match):
        trainer.fit(Graph.somatize(Linear()), data(), val=data(1))
    assert not (tmp_path / "ckpt").exists() or names(tmp_path / "ckpt") == []  # nothing trained


class Scored(Node):
    """Reports a node metric, which only an evaluation can name."""

    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)), metrics={"norm": x.norm()})


def test_a_node_metric_monitor_is_checked_at_the_first_evaluation(tmp_path):
    g = Graph.somatize(Scored())
    (node,) = g.topology.order
    result = best_trainer(tmp_path / "a", f"val_{node}/norm").fit(g, data(), val=data(1))
    assert result.best is not None and result.best_checkpoint is not None
    with pytest.raises(KeyError, match=rf"monitor='val_{node}/nrm'.*evaluated: .*val_{node}/norm"):
        best_trainer(tmp_path / "b", f"val_{node}/nrm").fit(g, data(), val=data(1))


def test_best_checkpoints_need_validation_data(tmp_path):
    trainer = best_trainer(tmp_path, "val_score")
    with pytest.raises(SettingError, match=r"Checkpointing\(best=1\).*no val= data"):
        trainer.fit(Graph.somatize(Linear()), data())
    assert not (tmp_path / "ckpt").exists()
