"""A small training run that resumes from its last checkpoint: the subject of the kill test.

    python tests/torch/scripts/resumable.py CKPT_DIR OUT_FILE [--hooks]
    python tests/torch/scripts/resumable.py --serve

Prints ``pid N`` first and ``step N`` after every step. With ``--hooks``, every
``os.fsync`` and ``os.replace`` (the steps of an atomic checkpoint write) first
prints ``hook fsync|replace NAME`` and waits for a line on standard input, so the
test can kill the process at that exact point. On success, writes the final state
and loss history to OUT_FILE (``torch.save``) and prints ``done``.

``--serve`` imports torch once and then, for each line ``CKPT_DIR OUT_FILE [--hooks]``
read from standard input, forks a process that trains as above, waits for it and
prints ``exit CODE`` (-9 when the test SIGKILLed it). Each training still runs in its
own process and dies by a real SIGKILL; only the seconds of importing torch are shared.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.watchers import StepEnd

STEPS_PER_EPOCH, EPOCHS = 6, 4


class Body(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(5, 16)
        self.drop = nn.Dropout(0.3)  # uses the torch RNG: resume must restore it exactly

    def forward(self, x, ctx):
        return Done(Opaque(self.drop(torch.relu(self.lin(x)))))


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(16, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data() -> tuple[list, list]:
    gen = torch.Generator().manual_seed(7)
    train = [
        (torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(STEPS_PER_EPOCH)
    ]
    val = [(torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen))]
    return train, val


def say(line: str) -> None:
    """One write per line: ``print`` under ``python -u`` writes the text and its newline
    apart, and a SIGKILL between the two glued the server's next line onto a half line."""
    os.write(1, line.encode() + b"\n")


class Lines:
    def on_event(self, event) -> None:
        if isinstance(event, StepEnd):
            say(f"step {event.step}")


def read_line() -> str | None:
    """One line of standard input (None at its end), read byte by byte: nothing read ahead."""
    out = b""
    while (c := os.read(0, 1)) != b"\n":
        if not c:
            return None
        out += c
    return out.decode()


def hook(name, real):
    def hooked(*args):
        target = os.path.basename(str(args[-1])) if name == "replace" else ""
        say(f"hook {name} {target}".rstrip())
        read_line()
        return real(*args)

    return hooked


def train(ckpt_dir: str, out: str, hooks: bool) -> None:
    say(f"pid {os.getpid()}")
    torch.set_num_threads(1)
    if hooks:
        os.fsync = hook("fsync", os.fsync)
        os.replace = hook("replace", os.replace)
    torch.manual_seed(123)  # every start builds the same fresh model; resume overwrites it
    g = Graph.somatize(Body() >> Head())
    train, val = data()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7),
        epochs=EPOCHS,
        metrics={"acc": st.accuracy},
        checkpoint=st.Checkpointing(ckpt_dir, every_steps=2, keep=2),
        watchers=[Lines()],
        pruner=st.Patience("val_loss", patience=50),
        seed=3,
        options=st.Options(progress=False, eval_every_steps=5),
    )
    result = trainer.fit(g, train, val=val, resume="last")
    with open(out + ".tmp", "wb") as f:
        torch.save(
            {"state": dict(result.state), "losses": result.losses, "metrics": result.metrics}, f
        )
    os.rename(out + ".tmp", out)
    say("done")


def serve() -> None:
    import torch._dynamo  # noqa: F401 -- the first optimizer step would import it in every child

    say("ready")
    while (line := read_line()) is not None:
        if not line.strip():
            continue
        ckpt_dir, out, *flags = line.split()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                train(ckpt_dir, out, "--hooks" in flags)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        say(f"exit {os.waitstatus_to_exitcode(status)}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        train(sys.argv[1], sys.argv[2], "--hooks" in sys.argv)
