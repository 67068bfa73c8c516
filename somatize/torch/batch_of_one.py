"""A note on BatchNorm's refusal of a training batch of one row, which torch words as
"Expected more than 1 value per channel when training" with the input's size alone.

It is nearly always the last batch of data whose size leaves one row over (a federated
client with 21 examples in batches of 10), met after many good steps, so the note says
which batch of which epoch it was, that it has one row, and what to do. The batch is
read from the failing frames of the step's code, as ``first_step`` reads it: nothing is
paid on the steps that go well.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import add_note
from .batches import num_examples

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["note_batch_of_one"]

_TORCH = "Expected more than 1 value per channel when training"


def note_batch_of_one(e: BaseException, trainer: Trainer, run: ActiveRun) -> None:
    """Add the note to ``e`` when it is BatchNorm's refusal of a batch of one row."""
    if not isinstance(e, ValueError) or _TORCH not in str(e):
        return
    found = _failing(e)
    if found is None:
        return
    first, last, x, batch, micro = found
    try:
        rows = num_examples(x)
    except Exception:  # (an input of the user's own form: no note rather than another error)
        return
    if rows != 1:  # (a model that reshapes its input: not a short batch)
        return
    s = run.state
    which = f"batch {last}" if first == last else f"one of batches {first}-{last}"
    where = f"{which} of epoch {s.epoch} (step {s.step + 1}{_listed(run.train, batch)})"
    if micro:
        add_note(
            e,
            f"the failing micro-batch of {where} has 1 row: Trainer(micro_batches="
            f"{trainer.micro_batches}) splits each batch into that many, and BatchNorm, "
            "training, needs more than one row to take a batch's statistics; use fewer "
            "micro-batches, or batches of at least two rows per micro-batch",
        )
        return
    add_note(
        e,
        f"{where} has 1 row, and BatchNorm, training, needs more than one to take "
        "a batch's statistics. It is usually the last batch of data whose size leaves one "
        "row over (21 examples in batches of 10): drop it with DataLoader(..., "
        "drop_last=True) (or leave the short last batch out of a list of batches), choose "
        "a batch size that leaves no single row over, or leave such a client out of a "
        "federated round",
    )


def _listed(train: Any, batch: Any) -> str:
    """``", train[j]"``: where ``batch`` is in a sequence of batches, which the epoch read
    in another order when it shuffled; "" for other data, or a batch not found."""
    if batch is None or not isinstance(train, Sequence) or isinstance(train, (str, bytes)):
        return ""
    j = next((j for j, b in enumerate(train) if b is batch), None)  # (on an error only)
    return "" if j is None else f", train[{j}] in the order given"


def _failing(e: BaseException) -> tuple[int, int, Any, Any, bool] | None:
    """(the epoch index of the step's first batch, of its last, the model's input, the
    batch when one, whether it was a micro-batch), read from the frames of the step that
    raised ``e``."""
    from .fastpath import fast_epoch
    from .step import step

    tb: types.TracebackType | None = e.__traceback__
    while tb is not None:
        code, local = tb.tb_frame.f_code, tb.tb_frame.f_locals
        if code is fast_epoch.__code__ and "x" in local and "i" in local:
            return local["i"], local["i"], local["x"], local.get("batch"), False
        if code is step.__code__ and "index" in local:
            last, group = local["index"], list(local.get("group") or ())
            first = last - max(len(group), 1) + 1
            one = group[0] if len(group) == 1 else None
            if "xc" in local:  # (the path of micro-batches and of accumulated groups)
                k = local.get("k", 1)
                micro = isinstance(k, int) and k > 1
                return first, last, local["xc"], None if micro else one, micro
            if "x" in local:
                return first, last, local["x"], one, False
        tb = tb.tb_next
    return None
