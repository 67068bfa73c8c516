"""Bad input: each a SettingError (or NodeError) naming the value and the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import NodeError, SettingError


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


def data():
    return [(torch.randn(4, 3), torch.randint(0, 2, (4,)))]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: st.Options(clip_grad_norm=-1.0),
            r"clip_grad_norm must be a number above 0, not -1.0.*ascent|flip",
        ),
        (lambda: st.Options(clip_grad_norm=0), "clip_grad_norm must be a number above 0"),
        (
            lambda: st.Options(clip_grad_value=-0.5),
            r"clip_grad_value must be a number above 0, not -0.5; .*None not to clip",
        ),
        (lambda: st.Options(clip_grad_value=0), "clip_grad_value must be a number above 0"),
        (lambda: st.Options(clip_grad_value="0.5"), r"clip_grad_value .* not '0.5'"),
        (lambda: st.Options(clip_grad_value=True), "clip_grad_value must be a number above 0"),
        (lambda: st.Options(clip_grad_value=float("nan")), "clip_grad_value must be a number"),
        (
            lambda: st.Options(clip_grad_value=float("inf")),
            r"clip_grad_value must be a finite number above 0, not inf: .*clamps nothing",
        ),
        (  # Lightning takes one algorithm: so does a run here
            lambda: st.Options(clip_grad_norm=1.0, clip_grad_value=0.5),
            r"Options\(clip_grad_norm=1.0, clip_grad_value=0.5\): a run clips one way.*pre-hook",
        ),
        (lambda: st.Options(eval_every_steps=0), "eval_every_steps must be at least 1, not 0"),
        (lambda: st.Options(eval_every_steps=-3), "eval_every_steps must be at least 1"),
        (lambda: st.Options(device="tpu-ish"), "not a torch device"),
        (
            lambda: st.Trainer(optimizer=sgd, epochs=2.6),
            r"epochs must be a whole number, not 2.6 \(did you mean epochs=3\?\)",
        ),
        (  # no suggestion that the next check would refuse
            lambda: st.Options(accumulate=0.4),
            r"accumulate must be a whole number, not 0.4; it is how",
        ),
        (
            lambda: st.Options(eval_every_steps=2.6),
            r"not 2.6 \(did you mean Options\(eval_every_steps=3\)\?\)",
        ),
        (  # Lightning's val_check_interval=0.25
            lambda: st.Options(eval_every_steps=0.25),
            r"optimizer steps between evaluations, not a fraction of an epoch.*=25",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, max_steps=2.5),
            "max_steps must be a whole number, not 2.5",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, metrics={"acc": 0.5}),
            "metric 'acc' is a float, neither a function",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, metrics={"loss": F.nll_loss}),
            r"metric name 'loss' is reserved: the loss is evaluated as val_loss",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, metrics={"val_acc": st.accuracy}),
            r"metric 'val_acc' would be evaluated as 'val_val_acc'.*without the val_ prefix "
            r"\('acc'\)",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, metrics=[st.accuracy]),
            r"metrics is a dict name → fn, not a list; e.g. metrics=\{'acc': st.accuracy\}",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, seed=-1),
            r"seed must be a whole number from 0 to 2\*\*32 - 1",
        ),
        (lambda: st.Trainer(optimizer=sgd, seed=2**40), "seed must be"),
        (lambda: st.Trainer(optimizer=sgd, seed=1.0), "seed must be"),
        (lambda: st.Trainer(optimizer=sgd, scheduler="cosine"), "scheduler must be a factory"),
        (lambda: st.Trainer(optimizer=sgd, micro_batches=0), "micro_batches must be at least 1"),
        (lambda: st.Checkpointing("x", every_steps=0), "every_steps must be at least 1"),
        (
            lambda: st.Trainer(loss=nn.CrossEntropyLoss, optimizer=sgd),
            r"loss is the class CrossEntropyLoss, not a loss; pass an instance, "
            r"CrossEntropyLoss\(\) or F.cross_entropy",
        ),
        (
            lambda: st.Trainer(loss=nn.MSELoss, optimizer=sgd),
            r"pass an instance, MSELoss\(\) or F.mse_loss",
        ),
        (lambda: st.Trainer(loss="mse", optimizer=sgd), "loss must be a function"),
        (
            lambda: st.Trainer(optimizer=sgd, watchers=[print]),
            r"Trainer\(watchers=\.\.\.\): <built-in function print> is not a watcher: a watcher "
            r"has a method on_event\(event\)",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, watchers=st.CSVLog("log.csv")),
            r"watchers is a list of watchers, not a CSVLog; write watchers=\[w\]",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, options={"progress": False}),
            r"options must be an st.Options, not a dict; e.g. "
            r"options=st.Options\(\*\*\{'progress': False\}\)",
        ),
        (
            lambda: st.Trainer(optimizer=sgd, checkpoint="runs/ckpt"),
            r"checkpoint must be an st.Checkpointing, not a str; e.g. "
            r"checkpoint=st.Checkpointing\('runs/ckpt', keep=3\)",
        ),
    ],
)
def test_bad_settings_name_the_value_and_the_fix(make, match):
    with pytest.raises(SettingError, match=match) as e:
        make()
    assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError)


def test_cuda_without_cuda_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    options = st.Options(device="cuda", progress=False)  # may be shipped to a GPU machine
    with pytest.raises(SettingError, match="'cuda' asks for CUDA, which this machine's torch"):
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=options).fit(
            Graph.somatize(Linear()), data()
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"optimizer": lambda ps: None},
            "optimizer factory returned NoneType, not a torch optimizer",
        ),
        (
            {"optimizer": lambda ps: torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)},
            "updates 1 of its 1 tensors that are not trainable parameters of the model",
        ),
        ({"optimizer": sgd, "scheduler": lambda opt: None}, "scheduler factory returned None"),
        (
            {"optimizer": lambda ps: [torch.optim.SGD(ps, lr=0.1), torch.optim.SGD(ps, lr=1)]},
            r"returned list, not a torch optimizer.*own parameter group",
        ),
        (  # before: a bare TypeError from LBFGS.step() at the first step
            {"optimizer": lambda ps: torch.optim.LBFGS(ps)},
            r"LBFGS needs a closure at every step.*Lightning.*opt.step\(closure\)",
        ),
        (  # before: "returned {'scheduler': ..., 'interval': 'step'}, not an LR scheduler"
            {
                "optimizer": sgd,
                "scheduler": lambda opt: {
                    "scheduler": torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=9),
                    "interval": "step",
                },
            },
            r"Lightning's lr_scheduler dict \(keys 'scheduler', 'interval'\).*"
            r"scheduler=lambda opt: OneCycleLR\(opt, \.\.\.\) \(stepped after every optimizer "
            r"step, the default",
        ),
        (  # Lightning's default interval is "epoch": say scheduler_every="epoch"
            {
                "optimizer": sgd,
                "scheduler": lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2)},
            },
            r"StepLR\(opt, \.\.\.\) with options=st.Options\(scheduler_every=\"epoch\"\)$",
        ),
        (
            {
                "optimizer": sgd,
                "scheduler": lambda opt: {
                    "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                    "monitor": "val_acc",
                    "frequency": 2,
                },
            },
            r"ReduceLROnPlateau\(opt, \.\.\.\) with options=st.Options\(monitor='val_acc'\); "
            r"'frequency' has no counterpart",
        ),
        (  # before: "returned dict, not a torch optimizer ... own parameter group"
            {"optimizer": lambda ps: {"optimizer": sgd(ps), "lr_scheduler": None}},
            r"Lightning's configure_optimizers dict \(keys 'optimizer', 'lr_scheduler'\).*"
            r"scheduler= is a factory of its own",
        ),
    ],
)
def test_bad_factories_are_refused_before_training(kwargs, match):
    g = Graph.somatize(Linear())
    before = {k: v.clone() for k, v in st.state(g).items()}
    with pytest.raises(SettingError, match=match):
        st.Trainer(loss=F.cross_entropy, options=st.Options(progress=False), **kwargs).fit(
            g, data()
        )
    assert all(torch.equal(v, before[k]) for k, v in st.state(g).items())


@pytest.mark.parametrize(
    ("batch", "said"),
    [
        ([[1, 2], [3, 4]], "holds no tensor to feed the model"),
        (3.0, "holds no tensor to feed the model"),
        ([[], torch.ones(1)], "holds no tensor to feed the model"),
        (("text", 1), r"each a single example \(\(str, int\).*DataLoader\(examples"),
    ],
)
def test_a_batch_without_a_tensor_is_refused(batch, said):
    with pytest.raises(SettingError, match=said):
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=st.Options(progress=False)).fit(
            Graph.somatize(Linear()), [batch]
        )


def test_one_dict_batch_as_the_data_is_refused_saying_pass_a_list():
    # before: read key by key, "a batch of type str holds no tensor"
    X, Y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(SettingError, match=r"train is one dict batch \('x', 'y'\).*\[batch\]"):
        st.Trainer(loss=F.cross_entropy, optimizer=sgd, options=st.Options(progress=False)).fit(
            Graph.somatize(Linear()), {"x": X, "y": Y}
        )


def test_patience_with_an_unknown_mode_is_a_setting_error():
    with pytest.raises(SettingError, match="Patience mode must be 'min' or 'max', not 'maximum'"):
        st.Patience("val_acc", mode="maximum")


def test_none_for_watchers_is_no_watchers_as_for_metrics_and_scheduler():
    # before: SettingError "not a NoneType; write watchers=[w]"
    t = st.Trainer(loss=F.cross_entropy, optimizer=sgd, watchers=None, metrics=None)
    assert t.watchers == []
    assert t.fit(Graph.somatize(Linear()), data()).steps > 0


def test_clipping_still_clips():
    st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, options=st.Options(clip_grad_norm=0.5, progress=False)
    ).fit(Graph.somatize(Linear()), data())


def test_a_node_forward_without_ctx_is_refused_at_g_node():
    class NoCtx(Node):
        def forward(self, x):
            return Done(x)

    class Star(Node):
        def forward(self, *args):
            return Done(args[0])

    g = Graph()
    with pytest.raises(
        NodeError,
        match=r"node 'bad': .*NoCtx.forward\(self, x\) takes no ctx.*def forward\(self, x, ctx\)",
    ):
        g.node("bad", NoCtx())
    assert "bad" not in g
    with pytest.raises(NodeError, match="takes no ctx"):
        Graph.somatize(NoCtx())
    g.node("ok", Star())  # *args takes ctx too


@pytest.mark.parametrize(
    ("resume", "match"),
    [
        (True, r"resume must be 'last' or a checkpoint's path, not True; pass resume='last'"),
        (1, "resume must be 'last' or a checkpoint's path, not 1"),
        ("latest", r"resume='latest' is neither 'last' nor a checkpoint's path.*resume='last'"),
        ("best", r"resume='best' is neither 'last' nor a checkpoint's path"),
    ],
)
def test_a_resume_that_is_not_last_or_a_path_says_so(tmp_path, resume, match):
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        checkpoint=st.Checkpointing(tmp_path / "ckpt"),
        options=st.Options(progress=False),
    )
    with pytest.raises(SettingError, match=match):
        trainer.fit(Graph.somatize(Linear()), data(), resume=resume)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_metrics_without_a_loss_are_refused_with_the_fix():
    # without loss= the graph gets the whole batch and returns its loss: nothing to measure
    with pytest.raises(SettingError, match=r"metrics= \('acc'\) measure.*Pass loss="):
        st.Trainer(optimizer=sgd, metrics={"acc": st.accuracy})
    pytest.importorskip("lightning")
    from somatize.torch.lightning import LightningGraph

    with pytest.raises(SettingError, match=r"without loss= the LightningGraph's graph"):
        LightningGraph(Graph(), loss=None, optimizer=sgd, metrics={"acc": st.accuracy})
