"""What the Trainer's optimizer and scheduler factories made, checked before any step: an
optimizer over the model's trainable parameters, stepped without a closure; an LR
scheduler over it (a ``ReduceLROnPlateau`` improving the way ``Options.mode`` says)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ..errors import SettingError

__all__ = ["check_no_closure", "check_optimizer", "check_scheduler"]


def check_optimizer(opt: Any, params: list[Any]) -> None:
    """What the optimizer factory made: an optimizer over the model's trainable parameters."""
    import torch

    if isinstance(opt, dict) and "optimizer" in opt:
        raise SettingError(
            "the optimizer factory returned Lightning's configure_optimizers dict (keys "
            f"{', '.join(map(repr, opt))}), not a torch optimizer; here optimizer= returns the "
            "optimizer alone, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3), and "
            "scheduler= is a factory of its own over it, scheduler=lambda opt: "
            "torch.optim.lr_scheduler.OneCycleLR(opt, max_lr, total_steps=...)"
        )
    if not isinstance(opt, torch.optim.Optimizer):
        several = (
            " (one optimizer a run: for another learning rate or weight decay on a part, "
            "give it its own parameter group, docs/trainer.md#parameter-groups)"
            if isinstance(opt, (list, tuple, dict))
            else ""
        )
        raise SettingError(
            f"the optimizer factory returned {type(opt).__qualname__}, not a torch optimizer; "
            "it must return one built over the parameters it is given, e.g. "
            f"optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3){several}"
        )
    own = {id(p) for p in params}
    given = [p for group in opt.param_groups for p in group["params"]]
    # (a frozen parameter given too, model.parameters() whole: torch skips it, its grad None)
    foreign = [p for p in given if id(p) not in own and p.requires_grad]
    if foreign or not any(id(p) in own for p in given):
        raise SettingError(
            f"the optimizer the factory returned updates {len(foreign)} of its {len(given)} "
            f"tensors that are not trainable parameters of the model (which has {len(params)}), "
            "so it would train nothing the run keeps; build it over the parameters the factory "
            "is given (lambda params: torch.optim.SGD(params, lr=0.1)), not another model's"
        )


def check_no_closure(opt: Any) -> None:
    """The Trainer steps its optimizer once a batch, without a closure: one whose ``step``
    needs a closure (``LBFGS``) is refused by name, not by a bare ``TypeError`` at step 1."""
    if _needs_closure(type(opt).step):
        raise SettingError(
            f"{type(opt).__qualname__} needs a closure at every step (it evaluates the loss "
            "again and again, as LBFGS does); st.Trainer steps its optimizer once a batch, "
            "without one. Train it with Lightning (st.lightning: its automatic optimization "
            "passes the closure), or with a loop of your own: opt.step(closure)"
        )


@functools.lru_cache(maxsize=64)  # (an optimizer class's step: the same every fit)
def _needs_closure(step: Any) -> bool:
    closure = inspect.signature(step).parameters.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty


def check_scheduler(sched: Any, options: Any) -> None:
    """What the scheduler factory made: an LR scheduler (not the optimizer itself, which
    would then step twice a step); a ``ReduceLROnPlateau``, stepped with
    ``Options.monitor``, must improve the way ``Options.mode`` says."""
    import torch

    example = "scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 10)"
    if isinstance(sched, torch.optim.Optimizer):
        raise SettingError(
            f"the scheduler factory returned the optimizer ({type(sched).__qualname__}), not "
            "an LR scheduler: the Trainer would step it twice a step; return a scheduler "
            f"built over it, e.g. {example}, or pass no scheduler"
        )
    if isinstance(sched, dict) and "scheduler" in sched:
        raise SettingError(_lightning_dict(sched))
    if sched is None or not callable(getattr(sched, "step", None)):
        raise SettingError(
            f"the scheduler factory returned {sched!r}, not an LR scheduler; it must return "
            f"one built over the optimizer it is given, e.g. {example}"
        )
    if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
        monitor, mode = options.monitor, options.mode
        if sched.mode != mode:
            raise SettingError(
                f"ReduceLROnPlateau(mode={sched.mode!r}) is stepped with "
                f"Options(monitor={monitor!r}), which improves by "
                f"{'falling' if mode == 'min' else 'rising'} (Options(mode={mode!r})), so it "
                "would cut the learning rate while the run improves; pass "
                f"ReduceLROnPlateau(opt, mode={mode!r}) (or set Options(mode=...) to the "
                "way the monitored metric improves)"
            )


def _lightning_dict(config: dict[Any, Any]) -> str:
    """What to write for Lightning's ``lr_scheduler`` dict returned by the factory: the
    scheduler itself, and its ``interval`` and ``monitor`` as ``Options``."""
    import torch

    inner = config["scheduler"]
    name = type(inner).__qualname__
    plateau = isinstance(inner, torch.optim.lr_scheduler.ReduceLROnPlateau)
    options = []
    # Lightning's default interval is "epoch"; a plateau is stepped after each evaluation
    if config.get("interval", "epoch") == "epoch" and not plateau:
        options.append('scheduler_every="epoch"')
    if "monitor" in config:
        options.append(f"monitor={config['monitor']!r}")
    said = (
        f" with options=st.Options({', '.join(options)})"
        if options
        else " (stepped after each evaluation, by Options(monitor=))"
        if plateau
        else ' (stepped after every optimizer step, the default: Options(scheduler_every="step"))'
    )
    rest = sorted(set(config) - {"scheduler", "interval", "monitor", "name", "strict"}, key=str)
    unsupported = (
        f"; {', '.join(map(repr, rest))} has no counterpart here (one scheduler, stepped once "
        "an optimizer step or an epoch)"
        if rest
        else ""
    )
    return (
        f"the scheduler factory returned Lightning's lr_scheduler dict (keys "
        f"{', '.join(map(repr, config))}), not an LR scheduler; here it returns the "
        f"scheduler itself, scheduler=lambda opt: {name}(opt, ...){said}{unsupported}"
    )
