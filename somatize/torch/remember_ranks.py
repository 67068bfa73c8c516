"""A remembered call under torchrun: every rank makes it, rank 0 decides.

Rank 0 holds the key's lock (against other jobs), decides between recalling and running
and broadcasts its decision; the other ranks run the function with it (the fit inside is
one DDP run) or recall, and never write. While rank 0 waits for another job's lock it
broadcasts ``WAIT`` every second, so that no collective waits on a file lock past the
process group's timeout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import KeeperError
from . import recalled

if TYPE_CHECKING:
    from .. import runkey
    from .remember import Remembered
    from .result_store import RememberedResult

__all__ = ["FAILED", "RECALL", "RUN", "RUN_UNKEYED", "WAIT", "broadcast", "call_ranks"]

# What rank 0 tells the other ranks of a remembered call.
WAIT, RECALL, RUN, RUN_UNKEYED, FAILED = range(5)


def broadcast(code: int) -> int:
    """Rank 0's ``code``, on every rank (a broadcast over the process group)."""
    flag = torch.tensor([code])
    if dist.get_backend() == "nccl":
        flag = flag.to("cuda")
    dist.broadcast(flag, src=0)
    return int(flag.item())


def call_ranks(
    remembered: Remembered,
    ck: runkey.CallKey,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    rank: int,
) -> RememberedResult:
    """This rank's part of a remembered call under torchrun."""
    if rank != 0:
        code = broadcast(0)
        while code == WAIT:
            code = broadcast(0)
        if code == FAILED:
            raise RuntimeError(
                f"rank 0 failed before it decided whether to run or recall {ck.function} "
                f"(key {ck.key[:16]}…); its error says why"
            )
        if code != RECALL:  # the checkpoints where rank 0 keeps them (or none)
            return remembered._follow(ck, args, kwargs, keyed=code == RUN)
        found = remembered._recall(ck.key)
        if found is None:
            raise KeeperError(
                f"rank {rank} cannot read the run {ck.key[:16]}… that rank 0 recalled from "
                f"{remembered.keeper!r}: under torchrun every rank reads the result, so the "
                "keeper must be one they all see (a DiskKeeper on a shared directory)"
            )
        return found
    decided = [False]

    def tell(code: int) -> None:
        decided[0] = code != WAIT
        broadcast(code)

    try:
        with remembered.store.lock(ck.key, waiting=lambda: tell(WAIT)):
            found = remembered._recall(ck.key)
            if found is not None:
                tell(RECALL)
                recalled.tell(ck, found)  # (rank 0 says so, once for the job)
                return found
            return remembered._compute(ck, args, kwargs, tell)
    except BaseException:
        if not decided[0]:  # the others wait for a decision: tell them there is none
            tell(FAILED)
        raise
