"""A loss of several terms (loss_terms.py): ``loss=fn`` returning ``{"loss": ..., "ce": ...,
...}`` trains on ``"loss"`` exactly as a plain loop does, and logs each term weighed as the
loss — per step (``StepEnd.terms``), in every evaluation (``val_<term>``), under DDP."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.errors import SettingError
from somatize.watchers import StepEnd
from tests.torch.trainer_helpers import make_graph, plain_copy, plain_state, quiet, step_parts

SIZES = [10, 10, 7, 10, 5]  # unequal batches: the weights matter


def data(sizes=SIZES, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)) for n in sizes
    ]


def vae_like(out, y):
    """Two tensor terms and a number (a batch's rows): the weighting of each shows."""
    ce = F.cross_entropy(out, y)
    reg = out.pow(2).mean()
    return {"loss": ce + 0.1 * reg, "ce": ce, "reg": reg, "rows": float(len(y))}


def plain_loop(batches, k, mb, epochs=2):
    """The steps by hand: groups of ``k`` batches in ``mb`` chunks, each weighed by its
    share of the group's examples (in float32, a chunk after the other); the model, each
    step's loss and terms."""
    m = plain_copy(make_graph())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses, terms = [], []
    for _ in range(epochs):
        for parts, n in step_parts(batches, k, mb):
            opt.zero_grad(set_to_none=True)
            if len(parts) == 1 and k == 1:  # the Trainer's single batch: no weights
                got = vae_like(m(parts[0][0]), parts[0][1])
                got["loss"].backward()
                got = {t: v.detach() if torch.is_tensor(v) else v for t, v in got.items()}
                losses.append(float(got["loss"]))
                terms.append({t: float(v) for t, v in got.items() if t != "loss"})
            else:
                total, sums = torch.zeros(()), {"ce": torch.zeros(()), "reg": torch.zeros(())}
                rows = 0.0
                for xc, yc in parts:
                    got = vae_like(m(xc), yc)
                    share = len(yc) / n
                    (got["loss"] * share).backward()
                    total += got["loss"].detach().float() * share
                    for t in sums:
                        sums[t] += got[t].detach().float() * share
                    rows += got["rows"] * share
                losses.append(float(total))
                terms.append({"ce": float(sums["ce"]), "reg": float(sums["reg"]), "rows": rows})
            opt.step()
    return m, losses, terms


@pytest.mark.parametrize(("k", "mb"), [(1, 1), (1, 3), (2, 1), (2, 3)])
@pytest.mark.parametrize("watched", [False, True], ids=["no-watcher", "watched"])
def test_terms_train_as_the_loss_alone_and_are_weighed_as_a_plain_loop_weighs_them(k, mb, watched):
    """Without watchers (k = mb = 1: the fast path) and with them (the general step): the
    weights bitwise a plain loop's on ``out["loss"]``, each step's terms its terms."""
    batches = data()
    model, losses, terms = plain_loop(batches, k, mb)
    recorder = Recorder()
    result = st.Trainer(
        loss=vae_like,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        micro_batches=mb,
        watchers=[recorder] if watched else [],
        options=quiet(shuffle=False, accumulate=k),
    ).fit(make_graph(), batches)
    assert result.losses == losses
    want = plain_state(model)
    for name, value in result.state.items():
        assert torch.equal(value, want[name]), name
    if watched:
        told = recorder.of(StepEnd)
        assert [dict(e.terms) for e in told] == terms
        assert [e.loss for e in told] == losses


def test_a_dict_loss_under_fp16_terms_are_unscaled():
    """Under fp16 the scaler multiplies the loss for backward; the terms told are the loss
    function's own values, as the step's loss is."""
    recorder = Recorder()
    st.Trainer(
        loss=vae_like,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[recorder],
        options=quiet(shuffle=False, precision="fp16"),
    ).fit(make_graph(), data([8, 8]))
    for e in recorder.of(StepEnd):
        assert 0.5 < e.terms["ce"] < 3 and e.terms["rows"] == 8.0
        assert e.loss == pytest.approx(e.terms["ce"] + 0.1 * e.terms["reg"], rel=1e-2)


def test_evaluation_averages_each_term_over_examples_after_the_loss():
    val = data([7, 3, 5], seed=2)  # unequal batches: a plain mean of the batches' terms differs
    g = make_graph()
    trainer = st.Trainer(loss=vae_like, metrics={"acc": st.accuracy}, options=quiet())
    got = trainer.evaluate(g, val)
    assert list(got) == ["loss", "ce", "reg", "rows", "acc"]
    net = plain_copy(g)
    with torch.no_grad():
        each = [(vae_like(net(x), y), len(y)) for x, y in val]
    n = sum(size for _, size in each)
    for term in ("loss", "ce", "reg"):
        expected = sum(float(v[term]) * size for v, size in each) / n
        assert got[term] == expected, term
    assert got["rows"] == (7 * 7 + 3 * 3 + 5 * 5) / 15  # rows weighed by rows
    # inside fit, named val_<term>, with a set's name for several
    fit = st.Trainer(
        loss=vae_like, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.0), options=quiet()
    )
    record = fit.fit(make_graph(), data([4]), val={"a": val, "b": val[:1]}).metrics[-1]
    assert record["val_a_ce"] == pytest.approx(got["ce"], rel=1e-12)
    assert record["val_b_rows"] == 7.0
    assert {"val_a_loss", "val_a_reg", "val_b_loss", "val_b_ce", "val_b_reg"} <= set(record)


class Spy(torch.optim.lr_scheduler.ReduceLROnPlateau):
    told: ClassVar[list[float]] = []

    def step(self, metrics, *a, **k):  # type: ignore[override]
        Spy.told.append(float(metrics))
        super().step(metrics, *a, **k)


class Pruner:
    """A pruner of a term: records what it is told."""

    metric = "val_ce"

    def __init__(self) -> None:
        self.told: list[float] = []

    def report(self, value, step):
        self.told.append(value)

    def should_prune(self):
        return False


def test_a_term_can_be_monitored_ranked_checkpointed_and_pruned_on(tmp_path):
    Spy.told = []
    pruner = Pruner()
    result = st.Trainer(
        loss=vae_like,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        scheduler=lambda opt: Spy(opt),
        epochs=4,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", best=1),
        pruner=pruner,
        options=quiet(monitor="val_ce"),
    ).fit(make_graph(), data(), val=data([6, 3], seed=2))
    ce = [m["val_ce"] for m in result.metrics]
    assert result.monitor == "val_ce" and result.best == min(ce)
    assert result.best_checkpoint.endswith(f"step-{5 * (ce.index(min(ce)) + 1):09d}.ckpt")
    assert Spy.told == ce == pruner.told


@pytest.mark.parametrize("sanity", [2, 0])
def test_a_monitor_no_evaluation_gives_is_refused_naming_the_terms(tmp_path, sanity):
    """A loss function of one's own may give terms, known once it runs: a name it does not
    give is refused by the sanity check, before any step — or, without it, at the first
    evaluation."""
    recorder = Recorder()
    trainer = st.Trainer(
        loss=vae_like,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        checkpoint=st.Checkpointing(tmp_path / "ckpt", best=1),
        watchers=[recorder],
        options=quiet(monitor="val_recon", sanity_val_batches=sanity),
    )
    with pytest.raises(KeyError, match=r"monitor='val_recon'.*val_loss, val_ce, val_reg, val_rows"):
        trainer.fit(make_graph(), data(), val=data([4]))
    assert len(recorder.of(StepEnd)) == (0 if sanity else len(SIZES))  # an epoch, or none
    # torch's own losses give no terms: a name they do not evaluate is refused at once
    cross = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=quiet(monitor="val_recon", sanity_val_batches=0),
    )
    with pytest.raises(KeyError, match=r"monitor='val_recon'.* evaluates val_loss"):
        cross.fit(make_graph(), data(), val=data([4]))


def test_a_term_named_as_a_metric_is_refused_naming_both():
    def clashing(out, y):
        return {"loss": F.cross_entropy(out, y), "acc": st.accuracy(out, y)}

    trainer = st.Trainer(
        loss=clashing,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        metrics={"acc": st.accuracy},
        options=quiet(),
    )
    match = r"term 'acc' has the name of the metric 'acc' of Trainer\(metrics=\.\.\.\)"
    with pytest.raises(SettingError, match=match) as evaluated:
        trainer.evaluate(make_graph(), data([4]))
    with pytest.raises(SettingError, match=match) as fitted:  # the sanity check, before any step
        trainer.fit(make_graph(), data(), val=data([4]))
    for caught in (evaluated, fitted):  # the loss returned it: not "raised in the loss function"
        assert not blamed_on_the_call(caught.value)


def blamed_on_the_call(e):
    """Whether ``e`` carries the note of a loss or metric that failed when called — which a
    refusal of what the loss function returned must not: the call was fine."""
    return any(n.startswith("raised in") for n in getattr(e, "__notes__", []))


def _scalar(out, y):
    return F.cross_entropy(out, y)


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"total": _scalar}, r"without a 'loss' entry \('total'\)"),
        ({"loss": lambda o, y: F.cross_entropy(o, y, reduction="none")}, r"'loss' entry is a Tensor of shape \(\d+,\), not a scalar"),
        ({"loss": _scalar, 3: _scalar}, r"has the key 3 \(int\); terms are named by strings"),
        ({"loss": _scalar, "ce": lambda o, y: o.mean(0)}, r"term 'ce' is a tensor of shape \(3,\); .*\.mean\(\)"),
        ({"loss": _scalar, "name": lambda o, y: "x"}, r"term 'name' is a str \('x'\), not a number"),
        ({"loss": _scalar, "lr": _scalar}, r"term 'lr' has the name of a value logged beside the loss"),
        ({"loss": _scalar, "a/b": _scalar}, r"term 'a/b' holds '/'"),
        ({"loss": _scalar, " ": _scalar}, r"term ' ' is blank: name it"),
        ({"loss": _scalar, "val_ce": _scalar}, r"term 'val_ce' would be evaluated as 'val_val_ce'"),
        ({"loss": _scalar, "epoch_ce": _scalar}, r"term 'epoch_ce' has the name of an epoch's mean"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("where", ["fast", "general", "evaluate"])
def test_a_dict_that_is_not_a_loss_and_its_terms_is_refused_naming_the_entry(given, match, where):
    def loss(out, y):
        return {k: fn(out, y) for k, fn in given.items()}

    trainer = st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[Recorder()] if where == "general" else [],
        options=quiet(),
    )
    with pytest.raises(SettingError, match=match) as caught:
        if where == "evaluate":
            trainer.evaluate(make_graph(), data([4]))
        else:
            trainer.fit(make_graph(), data([4]))
    assert isinstance(caught.value, TypeError)  # (a SettingError is one)
    assert not blamed_on_the_call(caught.value)  # (evaluate's note on a failed call, before)


def test_a_graph_returning_a_dict_with_its_loss_is_still_refused_without_loss():
    class Holds(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, batch):
            x, y = batch
            return {"loss": F.cross_entropy(self.lin(x), y), "ce": torch.tensor(0.0)}

    trainer = st.Trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), options=quiet())
    with pytest.raises(SettingError, match=r"returned a dict \('loss', 'ce'\), not its loss"):
        trainer.fit(Holds(), data([4]))


def test_lr_find_trains_on_the_loss_of_a_dict():
    found = st.Trainer(loss=vae_like, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)).lr_find(
        make_graph(), data([4] * 14), steps=14, stop_at=None
    )
    assert len(found.raw_losses) == 14 and found.suggestion is not None


def test_terms_are_in_the_run_log_the_csv_and_the_progress_line(tmp_path):
    import io

    from somatize import JsonLines

    stream = io.StringIO()
    recorder = Recorder()
    st.Trainer(
        loss=vae_like,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[
            recorder,
            JsonLines(tmp_path / "run.jsonl"),
            st.Progress(stream, redraw=False, every_steps=1),
        ],
        options=quiet(shuffle=False),
    ).fit(make_graph(), data())
    told = recorder.of(StepEnd)
    logged = [r for r in JsonLines.read(tmp_path / "run.jsonl") if r["event"] == "StepEnd"]
    assert [r["terms"] for r in logged] == [dict(e.terms) for e in told]
    first = told[0].terms
    assert f"loss {told[0].loss:.4f} ce {first['ce']:.4g} reg {first['reg']:.4g} rows 10" in (
        stream.getvalue()
    )


def test_a_step_without_terms_tells_none():
    recorder = Recorder()
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        watchers=[recorder],
        options=quiet(),
    ).fit(make_graph(), data())
    assert all(e.terms == {} for e in recorder.of(StepEnd))


@pytest.mark.slow
def test_under_ddp_the_terms_are_over_every_ranks_examples(tmp_path):
    from tests.torch.test_ddp import said, torchrun

    assert torchrun(tmp_path, script="ddp_terms.py") == 0, said(tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r1["steps"] == [] and len(r0["steps"]) == 8  # only rank 0 is told
    for loss, terms, examples in r0["steps"]:
        assert terms["ce"] == loss  # weighed as the loss, in the same all-reduce
        assert terms["rank"] == pytest.approx((examples - 4) / examples)  # rank 1's share
    assert [e for _, _, e in r0["steps"]] == [8, 8, 8, 7] * 2  # (4 + 3: the last step)
    assert r0["metrics"] == r1["metrics"]  # every rank evaluates over all ranks' batches
    for m in r0["metrics"]:
        assert m["val_all_ce"] == pytest.approx(m["val_all_loss"], rel=1e-12)
        assert m["val_all_rank"] == pytest.approx(7 / 15)  # rank 1 evaluated batch 1 (7 of 15)
        assert m["val_one_rank"] == 0.0  # rank 1 saw no batch of it, and names the term too
    # each epoch's mean: over every rank's examples (31: rank 1's 15), the same on each rank
    assert r0["epoch_losses"] == r1["epoch_losses"] == [loss for loss, _ in r0["epochs"]]
    for e, (loss, terms) in enumerate(r0["epochs"]):
        told = r0["steps"][4 * e : 4 * e + 4]
        assert loss == pytest.approx(sum(v * n for v, _, n in told) / 31, rel=1e-12)
        assert terms["ce"] == pytest.approx(loss, rel=1e-12)
        assert terms["rank"] == pytest.approx(15 / 31)
    # under nonfinite="ignore" each rank's, all-reduced with the losses at the epoch's end
    # (epoch 0 alike; its last step, of unequal batches, is not weighed by the ranks'
    # examples there, so epoch 1 trains otherwise)
    assert r0["ignored"] == r1["ignored"]
    # TrainResult.terms: what rank 0 was told, on every rank; under "ignore" the ranks' mean
    assert (
        r0["terms"]
        == r1["terms"]
        == {name: [terms[name] for _, terms, _ in r0["steps"]] for name in ("ce", "rank")}
    )
    assert r0["ignored_terms"] == r1["ignored_terms"]
    assert r0["ignored_terms"]["ce"] == pytest.approx(r0["ignored_losses"], rel=1e-6)
    assert len(r0["ignored_terms"]["rank"]) == 8
    # TrainResult.epoch_terms: EpochEnd.terms, on every rank; under "ignore" over every
    # rank's examples too (all-reduced with the losses' sums at the epoch's end)
    assert r0["epoch_terms"] == r1["epoch_terms"]
    assert [dict(zip(r0["epoch_terms"], v)) for v in zip(*r0["epoch_terms"].values())] == [
        t for _, t in r0["epochs"]
    ]
    assert r0["ignored_epoch_terms"] == r1["ignored_epoch_terms"]
    assert r0["ignored_epoch_terms"]["ce"] == pytest.approx(r0["ignored"], rel=1e-6)
    assert r0["ignored"][0] == pytest.approx(r0["epoch_losses"][0], rel=1e-6)


def test_two_val_sets_whose_terms_would_share_a_name_are_refused():
    def loss(out, y):
        ce = F.cross_entropy(out, y)
        return {"loss": ce, "x": ce, "b_x": ce}  # set "a": val_a_b_x; set "a_b": val_a_b_x

    trainer = st.Trainer(loss=loss, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(SettingError, match=r"val set 'a_b' evaluates 'val_a_b_x', which an earl"):
        trainer.fit(make_graph(), data(), val={"a": data([4]), "a_b": data([4])})
