"""Remembered runs in processes the tests SIGKILL: a server that forks one process per command.

    python tests/torch/scripts/remembered.py

Reads commands from standard input, one a line, and answers on standard output; every
line a child writes starts with its pid:

    run KEEPER OUT [--hold]   fork a remembered training run; OUT gets its result
    fed KEEPER OUT [--plain] [--stop-at=round_R_client_C_step_N]
                              fork a federated loop of remembered client runs (--plain:
                              not remembered, the reference); OUT gets the final state;
                              --stop-at: print that step's line, then wait to be killed
    wait PID                  reap a child: prints ``exit PID CODE`` (-9 when SIGKILLed)

A run prints ``PID step N`` after each step and ``PID fit done`` when ``fit`` returns.
With ``--hold`` it prints ``PID flock`` when it asks for a run's lock, and, when it
computes, ``PID computing`` and then waits for SIGUSR1 before training.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque
from somatize.watchers import StepEnd

HOLD = False  # read by train_one: a data global, so part of its key (the same in both racers)


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


def say(text: str) -> None:
    tell(f"{os.getpid()} {text}")


def tell(line: str) -> None:
    """One write per line: ``print`` under ``python -u`` writes the text and its newline
    apart, and a SIGKILL between the two glued the server's next line onto a half line."""
    os.write(1, line.encode() + b"\n")


class Lines:
    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def on_event(self, event) -> None:
        if isinstance(event, StepEnd):
            say(f"{self.prefix}step {event.step}")
            # not a global: a global the code reads is part of the runs' keys
            if f"{self.prefix}step {event.step}" == os.environ.get("STOP_AT"):
                while True:
                    signal.pause()


def batches(seed: int, n: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def train_one(seed: int, data: list, epochs: int = 4) -> st.TrainResult:
    if HOLD:
        say("computing")
        signal.sigwait([signal.SIGUSR1])
    torch.manual_seed(123)  # every start builds the same fresh model; resume overwrites it
    g = Graph.somatize(Body() >> Head())
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        epochs=epochs,
        checkpoint=st.run_checkpointing(every_steps=2, keep=2),
        watchers=[Lines()],
        seed=seed,
        options=st.Options(progress=False),
    )
    result = trainer.fit(g, data, resume="last")
    say("fit done")
    return result


def train_client(global_state: dict, shard: list, round: int, client: int) -> st.TrainResult:
    torch.manual_seed(0)
    g = Graph.somatize(Body() >> Head())
    st.load_state(g, global_state)
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05),
        epochs=2,
        checkpoint=st.run_checkpointing(every_steps=1, keep=1),
        watchers=[Lines(f"round {round} client {client} ")],
        seed=round,
        options=st.Options(progress=False),
    )
    return trainer.fit(g, shard, resume="last")


ROUNDS, CLIENTS = 4, 3


def federate(keeper: str, plain: bool) -> tuple[dict, int]:
    client = train_client if plain else st.remember(train_client, keeper=DiskKeeper(keeper))
    shards = [batches(100 + c, 3) for c in range(CLIENTS)]
    torch.manual_seed(0)
    global_state = st.state(Graph.somatize(Body() >> Head()))
    recalled = 0
    for r in range(ROUNDS):
        results = [client(global_state, shards[c], r, c) for c in range(CLIENTS)]
        recalled += sum(bool(getattr(res, "recalled", False)) for res in results)
        global_state = st.fedavg(results)
    return dict(global_state), recalled


def save(out: str, payload: dict) -> None:
    with open(out + ".tmp", "wb") as f:
        torch.save(payload, f)
    os.rename(out + ".tmp", out)


def child(command: str, keeper: str, out: str, flags: list[str]) -> None:
    global HOLD
    import faulthandler

    # a child still running after 90 s is stuck: its threads' stacks go to the log the
    # test prints (a run here takes a few seconds)
    faulthandler.dump_traceback_later(90, exit=False)
    torch.set_num_threads(1)
    say("pid")
    for flag in flags:
        if flag.startswith("--stop-at="):
            os.environ["STOP_AT"] = flag.removeprefix("--stop-at=").replace("_", " ")
    if command == "fed":
        state, recalled = federate(keeper, "--plain" in flags)
        save(out, {"state": state, "recalled": recalled})
        return
    if "--hold" in flags:
        import fcntl

        HOLD = True
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])  # for sigwait
        real = fcntl.flock

        def flock(fd, op):
            if op == fcntl.LOCK_EX:
                say("flock")
            return real(fd, op)

        fcntl.flock = flock
    train = st.remember(train_one, keeper=DiskKeeper(keeper))
    result = train(3, batches(7, 6))
    say("recalled" if result.recalled else "computed")
    save(
        out,
        {
            "state": dict(result.state),
            "losses": result.losses,
            "recalled": result.recalled,
            "key": result.key,
        },
    )


def read_line() -> str | None:
    out = b""
    while (c := os.read(0, 1)) != b"\n":
        if not c:
            return None
        out += c
    return out.decode()


def serve() -> None:
    import torch._dynamo  # noqa: F401 -- the first optimizer step would import it in every child

    tell("ready")
    while (line := read_line()) is not None:
        if not line.strip():
            continue
        command, *rest = line.split()
        if command == "wait":
            _, status = os.waitpid(int(rest[0]), 0)
            tell(f"exit {rest[0]} {os.waitstatus_to_exitcode(status)}")
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(0)  # the server's commands are not the child's to read
                child(command, rest[0], rest[1], rest[2:])
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                os._exit(code)


if __name__ == "__main__":
    serve()
