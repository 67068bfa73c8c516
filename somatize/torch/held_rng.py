"""Random generators the training data holds for itself, checkpointed with the run.

A dataset's ``self.rng = np.random.default_rng(0)`` (augmentation read in this process,
``num_workers=0``) or a ``WeightedRandomSampler(generator=g)`` draws from a generator the
fit neither seeds nor owns. Their states go into every checkpoint beside the global ones
(``held_rng`` as the checkpoint is written, ``epoch_held_rng`` as the epoch began, for a
mid-epoch resume's replay), as tensors, numbers, strings and lists — loadable with
``weights_only=True`` — and a resume puts them back, found again by their attribute path
(``dataset.rng``, ``sampler.generator``). Only a generator whose state cannot be read
(``random.SystemRandom``) is warned of (``warn_unkept``).
"""

from __future__ import annotations

import contextlib
import random
import warnings
from typing import Any

import torch

from ..stack import outside

__all__ = ["find_held", "held_generators", "held_states", "put_held", "restore_held", "warn_unkept"]

_GENERATOR_TYPES = ("Generator", "RandomState", "BitGenerator", "Random", "SystemRandom")
_MODULES = ("torch", "numpy.random", "random")

Held = list[tuple[str, Any]]  # (attribute path, generator)


def find_held(data: Any) -> Held:
    """Random generators a DataLoader's data holds that the process draws from: in its
    dataset (``self.rng = np.random.default_rng(0)``, a transform holding a
    ``torch.Generator``) when read in this process (``num_workers=0``: workers get a fresh
    copy each epoch, so those draws repeat), and a sampler's own ``generator`` (a
    ``WeightedRandomSampler(generator=g)``; a ``RandomSampler``'s is the Trainer's, seeded
    each epoch). Each with its attribute path: ``dataset.rng``, ``sampler.generator``."""
    found: Held = []
    if getattr(data, "num_workers", 1) == 0 and hasattr(data, "dataset"):
        with contextlib.suppress(Exception):  # (a look at the data never fails a fit)
            _walk(data.dataset, "dataset", found, set(), 4)
    sampler = getattr(data, "sampler", None)
    batch_sampler = getattr(data, "batch_sampler", None)
    for name, s in (
        ("sampler", sampler),
        ("batch_sampler.sampler", getattr(batch_sampler, "sampler", None)),
    ):
        if s is None or isinstance(s, torch.utils.data.RandomSampler):
            continue
        if name != "sampler" and s is sampler:
            continue
        gen = getattr(s, "generator", None)
        if gen is not None and _is_generator(gen):
            found.append((f"{name}.generator", gen))
    return found


def held_generators(data: Any) -> list[str]:
    """The attribute paths of ``find_held(data)``."""
    return [path for path, _ in find_held(data)]


def held_states(held: Held) -> dict[str, Any]:
    """Each held generator's state, by path, as a checkpoint stores it (those whose state
    cannot be read, ``SystemRandom``, left out)."""
    out = {}
    for path, gen in held:
        state = _state(gen)
        if state is not None:
            out[path] = state
    return out


def put_held(held: Held, states: dict[str, Any]) -> list[str]:
    """Put ``held_states``' states back into the generators of the same paths; the paths
    of those it had no state for."""
    missing = []
    for path, gen in held:
        if path in states:
            _set_state(gen, states[path])
        else:
            missing.append(path)
    return missing


def restore_held(held: Held, states: dict[str, Any] | None) -> None:
    """A resume: the held generators as the checkpoint left them. Warns of those it
    cannot put back (a checkpoint written before they were kept, another dataset)."""
    if not held:
        return
    missing = put_held(held, states) if states is not None else [p for p, _ in held]
    if missing:
        warnings.warn(
            f"the training DataLoader holds random generators ({', '.join(missing)}) the "
            "checkpoint resumed from holds no state for (it was written before they were "
            "checkpointed, or with other data): this resumed run draws from them as they were "
            "made, not where the interrupted run left them, so it will not be bitwise "
            "identical to an uninterrupted run",
            UserWarning,
            stacklevel=outside(),
        )


def warn_unkept(held: Held) -> None:
    """Warn, when a run writes or resumes checkpoints, of held generators whose state
    cannot be read (``random.SystemRandom``): no checkpoint holds them."""
    unkept = [path for path, gen in held if _state(gen) is None]
    if unkept:
        warnings.warn(
            f"the training DataLoader holds random generators whose state cannot be read "
            f"({', '.join(unkept)}: the operating system's randomness), so no checkpoint holds "
            "them and no run drawing from them is reproducible; draw from a seeded generator "
            "(np.random.default_rng(seed), torch.Generator().manual_seed(seed)) or the global "
            "ones, which the fit seeds from `seed`",
            UserWarning,
            stacklevel=outside(),
        )


def _state(gen: Any) -> Any:
    if isinstance(gen, torch.Generator):
        return gen.get_state()
    if isinstance(gen, random.SystemRandom):
        return None
    if isinstance(gen, random.Random):
        version, internal, gauss = gen.getstate()
        return ["random", version, torch.tensor(internal, dtype=torch.int64), gauss]
    if hasattr(gen, "bit_generator"):  # numpy's Generator
        return ["bit_generator", _plain(gen.bit_generator.state)]
    if hasattr(gen, "get_state"):  # numpy's RandomState
        return ["legacy", _plain(gen.get_state(legacy=False))]
    if hasattr(gen, "state"):  # numpy's BitGenerator itself
        return ["bit_generator", _plain(gen.state)]
    return None


def _set_state(gen: Any, state: Any) -> None:
    if isinstance(gen, torch.Generator):
        gen.set_state(state)
        return
    kind, *rest = state
    if kind == "random":
        version, internal, gauss = rest
        gen.setstate((version, tuple(internal.tolist()), gauss))
    elif kind == "legacy":
        gen.set_state(_numpy(rest[0]))
    elif hasattr(gen, "bit_generator"):
        gen.bit_generator.state = _numpy(rest[0])
    else:
        gen.state = _numpy(rest[0])


def _plain(value: Any) -> Any:
    """numpy's state dict with its arrays as tagged lists of ints (weights_only loads them)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "dtype") and hasattr(value, "tolist"):
        return {"__array__": value.tolist(), "dtype": str(value.dtype)}
    return value


def _numpy(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__array__", "dtype"}:
            import numpy as np

            return np.asarray(value["__array__"], dtype=value["dtype"])
        return {k: _numpy(v) for k, v in value.items()}
    return value


def _is_generator(value: Any) -> bool:
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    return any(module.startswith(m) for m in _MODULES) and any(
        c.__name__ in _GENERATOR_TYPES for c in cls.__mro__
    )


def _walk(value: Any, path: str, found: Held, seen: set[int], depth: int) -> None:
    """Attributes of ``value`` (and small containers) that are generators, to ``depth``."""
    if id(value) in seen or depth < 0 or isinstance(value, (torch.Tensor, str, bytes)):
        return
    seen.add(id(value))
    if _is_generator(value):
        found.append((path, value))
        return
    if isinstance(value, (list, tuple)):
        if len(value) <= 32:  # (a dataset's rows are no place for a generator)
            for i, v in enumerate(value):
                _walk(v, f"{path}[{i}]", found, seen, depth - 1)
        return
    if isinstance(value, dict):
        if len(value) <= 32:
            for k, v in value.items():
                _walk(v, f"{path}[{k!r}]", found, seen, depth - 1)
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(value, (type, torch.nn.Module)):
        for k, v in attrs.items():
            _walk(v, f"{path}.{k}", found, seen, depth - 1)
