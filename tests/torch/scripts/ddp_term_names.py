"""Loss terms whose names differ between ranks, launched by
``tests/torch/test_term_names.py`` as

    torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port PORT \
        tests/torch/scripts/ddp_term_names.py OUT_DIR

Eight training batches of 4 rows, but the sixth, rank 1's third, of 6: rank 1's loss
gives a term ``aux`` at every step (``first``), or only on that batch (``later``: at
step 3, also in micro-batches of 3 rows), or the same terms as rank 0's in another order
(``order``, which trains). Each fit that fails must fail on both ranks with a
``SettingError`` (kept as text), none left waiting in a collective: the script makes the
process group itself, so the Trainer leaves it alone after a failed fit, and the fit
after them (``order``) runs on it. Every rank writes what it got to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.errors import SettingError
from somatize.watchers import StepEnd


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)

    train = [batch(6 if i == 5 else 4) for i in range(8)]

    def first(out: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        ce = F.cross_entropy(out, y)
        return {"loss": ce, "ce": ce, **({"aux": ce * 0} if rank == 1 else {})}

    def later(out: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        ce = F.cross_entropy(out, y)
        return {"loss": ce, "ce": ce, **({"aux": ce * 0} if len(y) in (3, 6) else {})}

    def order(out: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        ce = F.cross_entropy(out, y)
        terms = {"ce": ce, "rank": float(rank)}
        return {"loss": ce, **(terms if rank == 0 else dict(reversed(terms.items())))}

    def fit(loss: Any, watchers: list[Any] = (), micro_batches: int = 1, **options: Any) -> str:
        torch.manual_seed(0)
        trainer = st.Trainer(
            loss=loss,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            micro_batches=micro_batches,
            watchers=list(watchers),
            options=st.Options(progress=False, shuffle=False, **options),
        )
        try:
            trainer.fit(torch.nn.Linear(4, 3), train)
        except SettingError as e:
            return str(e)
        return ""

    recorder = Recorder()
    said = {
        "first": fit(first),
        "first_ignore": fit(first, nonfinite="ignore"),
        "later": fit(later, [Recorder()]),
        "later_micro": fit(later, micro_batches=2),
        "order": fit(order, [recorder]),
    }
    steps = [(e.loss, dict(e.terms), e.examples) for e in recorder.of(StepEnd)]
    dist.barrier()
    dist.destroy_process_group()
    torch.save({"said": said, "steps": steps}, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
