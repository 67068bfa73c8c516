"""State a node carries across steps within a run — truncated BPTT's hidden state.

A node keeps it in a ``Carry`` attribute. The Trainer resets every ``Carry`` of the
model to None at the start of each epoch and of each evaluation (and gives training
its own back after an evaluation in the middle of an epoch); ``evaluate`` and
``predict`` start from None too. A ``Carry`` is not a tensor attribute, so it never
becomes a buffer: it is not in ``state_dict()`` or ``state(g)``. A checkpoint written in
the middle of an epoch holds every ``Carry``'s value (``payload["carry"]``, detached
tensors), so a run resumed there goes on from the state the interrupted one had.

Example:
    >>> class LM(Node):                                    # doctest: +SKIP
    ...     def __init__(self):
    ...         self.rnn = nn.LSTM(8, 8, batch_first=True)
    ...         self.hidden = Carry()
    ...     def forward(self, x, ctx):
    ...         out, h = self.rnn(x, self.hidden.value)    # None at the start: zeros
    ...         self.hidden.set(h)                         # detached: truncated backprop
    ...         return Done(Opaque(out))
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from ..errors import CacheError, SettingError
from ..graph import Graph
from ..node import Node
from ..stack import outside

__all__ = [
    "Carry",
    "carries",
    "check_carried",
    "check_last_batch",
    "named_carries",
    "refuse_remembered",
    "reset",
    "start_epoch",
    "stored",
]


class Carry:
    """A value a node keeps from one step to the next, reset by the Trainer.

    Args:
        detach: ``set`` detaches the tensors it is given (nested tuples, lists and
            dicts too), so gradients stop at the step boundary — truncated backprop
            through time. False keeps them attached.

    Attributes:
        value: what the last ``set`` stored; None after a reset.
    """

    __slots__ = ("detach", "value")
    # Whether a Carry may exist in this process: set by making one, by copying or
    # unpickling one (__setstate__), and by defining a subclass (whose instances may skip
    # __init__). Until then no model holds one and ``named_carries`` has nothing to find.
    made: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Carry.made = True

    def __init__(self, *, detach: bool = True) -> None:
        Carry.made = True
        self.detach = detach
        self.value: Any = None

    def __setstate__(self, state: Any) -> None:  # (copied or unpickled: no __init__)
        Carry.made = True
        _, slots = state  # (no __dict__: its slots' values)
        for name, value in slots.items():
            setattr(self, name, value)

    def set(self, value: Any) -> None:
        self.value = _detached(value) if self.detach else value

    def reset(self) -> None:
        self.value = None

    def __repr__(self) -> str:
        return f"Carry({'empty' if self.value is None else type(self.value).__name__})"


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def carries(net: nn.Module) -> list[Carry]:
    """Every ``Carry`` of a model: in its graph's nodes (subgraphs and held nodes too) and
    in the ``__dict__`` of its modules."""
    return list(named_carries(net).values())


def named_carries(net: nn.Module) -> dict[str, Carry]:
    """Every ``Carry`` of a model, by where it is held: ``"node 'lm' (.hidden)"`` for a
    node's attribute (``.hiddens[0]`` in a list, tuple or dict of them), ``"module rnn
    (.state)"`` for a module's; each ``Carry`` once."""
    if not Carry.made:  # (no Carry exists: none is held; no walk of every module)
        return {}
    found: dict[int, tuple[str, Carry]] = {}
    graph = getattr(net, "graph", None)
    if isinstance(graph, Graph):
        _visit(graph, "", found, set())
    for name, m in net.named_modules():
        for attr, value in vars(m).items():
            # (most of a module's attributes hold none: asked first, without a call; torch's
            # own dicts — parameters, buffers, submodules, hooks — hold none either)
            if type(value) in _CONTAINERS:
                if attr in _TORCH_OWN:
                    continue
            elif not isinstance(value, Carry):
                continue
            for at, c in _held(value, attr):
                where = f"module {name!r} ({at})" if name else f"the model ({at})"
                found.setdefault(id(c), (where, c))
    return dict(found.values())


def _visit(obj: Any, where: str, found: dict[int, tuple[str, Carry]], seen: set[int]) -> None:
    """The carries of a graph's nodes (subgraphs, held and mapped nodes too) into ``found``."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Graph):
        for node_id in obj.nodes():
            _visit(obj[node_id], f"{where}/{node_id}" if where else node_id, found, seen)
        return
    inner = getattr(obj, "inner", None)  # a Mapped node's node
    if isinstance(inner, Node):
        _visit(inner, where, found, seen)
    for attr, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
        if isinstance(value, (Node, Graph)):
            _visit(value, where, found, seen)
        if type(value) not in _CONTAINERS and not isinstance(value, Carry):
            continue
        for at, c in _held(value, attr):
            found.setdefault(id(c), (f"node {where!r} ({at})", c))


_CONTAINERS = (list, tuple, dict)  # what _held looks into (exactly these types)
# what nn.Module.__init__ puts in every module's __dict__: tensors, modules and hooks only
_TORCH_OWN = frozenset(vars(nn.Module()))


def _held(value: Any, attr: str) -> list[tuple[str, Carry]]:
    """The carries an attribute holds: itself, or those in its list, tuple or dict (one a
    layer, ``self.hiddens = [Carry(), Carry()]``), named ``.attr[i]``."""
    if isinstance(value, Carry):
        return [(f".{attr}", value)]
    if type(value) in (list, tuple):
        return [(f".{attr}[{i}]", v) for i, v in enumerate(value) if isinstance(v, Carry)]
    if type(value) is dict:
        return [(f".{attr}[{k!r}]", v) for k, v in value.items() if isinstance(v, Carry)]
    return []


def refuse_remembered(g: Graph) -> None:
    """A cached node whose state moves on from call to call cannot be cached: a hit does
    not run ``forward``, so its ``Carry`` would stand still and every later call of the
    same input be served the first call's output.

    Raises:
        CacheError: naming the node, where it holds the ``Carry``, and the fix.
    """
    if not Carry.made:  # (no Carry exists: no node holds one)
        return
    memory = g.memory
    if not (memory.cached or memory.named):  # (most graphs: only their subgraphs to look at)
        for sub in g._subgraphs().values():
            refuse_remembered(sub)
        return
    for node_id, impl in g._impls.items():
        if isinstance(impl, Graph):
            refuse_remembered(impl)
        if not memory.remembers(node_id):
            continue
        found: dict[int, tuple[str, Carry]] = {}
        _visit(impl, node_id, found, set())
        if found:
            held = ", ".join(sorted(where for where, _ in found.values()))
            raise CacheError(
                f"node {node_id!r} is cached, but it carries state from call to call "
                f"(st.Carry in {held}): a hit does not run forward, so the state would not "
                "move on and a later call of the same input would be served the first "
                f"call's output; stop caching it (g.cache({node_id!r}, False)), or cache "
                "a node before it that holds no state"
            )


def reset(found: list[Carry]) -> None:
    """Reset each of them to None."""
    for c in found:
        c.value = None


def stored(found: list[Carry]) -> list[dict[str, Any]]:
    """Each ``Carry``'s value as a checkpoint holds it: ``{"value": v}`` (tensors detached,
    on the CPU) when it is tensors, numbers, strings and None in tuples, lists and dicts
    (what ``torch.load(weights_only=True)`` reads); ``{"kind": name}`` for anything else."""
    return [
        {"value": _plain(c.value)} if _storable(c.value) else {"kind": type(c.value).__qualname__}
        for c in found
    ]


def start_epoch(
    found: list[Carry], saved: list[Any] | None, position: int, device: Any, rank: int = 0
) -> None:
    """Reset every ``Carry`` as an epoch starts, or, for an epoch resumed at batch
    ``position`` > 0, put back the values its checkpoint saved: ``saved[rank]`` (each
    rank's ``stored``, in rank order).

    Warns:
        UserWarning: a resumed epoch has no saved value for some ``Carry`` (a checkpoint
            from before they were kept, another model, or a value that could not be
            stored): it starts from None and the run is not bitwise the uninterrupted one.
    """
    reset(found)
    if not position or not found:
        return
    mine = saved[rank] if saved is not None and rank < len(saved) else None
    entries = mine if isinstance(mine, list) and len(mine) == len(found) else None
    lost = []
    for i, c in enumerate(found):
        entry = entries[i] if entries is not None else None
        if isinstance(entry, dict) and "value" in entry:
            c.value = _to(entry["value"], device)
        else:
            lost.append(entry.get("kind", "?") if isinstance(entry, dict) else "not saved")
    if lost:
        why = (
            f"its checkpoint holds no carried state for {len(found)} st.Carry (written before "
            "it was kept, or by another model)"
            if entries is None
            else f"the carried value(s) of type {sorted(set(lost))} could not be checkpointed "
            "(only tensors, numbers, strings and None, in tuples, lists and dicts can)"
        )
        warnings.warn(
            f"resumed in the middle of an epoch (batch {position}), but {why}: the rest of the "
            "epoch starts from None, so the run is not bitwise identical to an uninterrupted "
            "one. Resume from a checkpoint written at an epoch's end for an exact resume",
            UserWarning,
            stacklevel=outside(),
        )


def _storable(value: Any) -> bool:
    if value is None or type(value) in (bool, int, float, str) or isinstance(value, torch.Tensor):
        return True
    if type(value) in (tuple, list):
        return all(_storable(v) for v in value)
    if type(value) is dict:
        return all(type(k) in (str, int) and _storable(v) for k, v in value.items())
    return False


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _to(value: Any, device: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def check_carried(
    named: dict[str, Carry], micro_batches: int, train: Any, shuffle: bool, world: int = 1
) -> None:
    """What a run whose model carries state (``named``: ``named_carries``) cannot do.

    Raises:
        SettingError: ``micro_batches`` > 1 — the chunks of a batch would hand one state on
            from chunk to chunk (chunk 2's rows starting from chunk 1's state), silently
            unlike the whole batch.

    Warns:
        UserWarning: the training order is shuffled (a sequence of batches with
            ``Options(shuffle=True)``, the default, or a DataLoader with ``shuffle=True``):
            each batch would start from the state of a batch that did not precede it.
            Under DDP (``world`` > 1), each rank takes every ``world``-th batch (or row):
            a rank's state skips the batches between.
    """
    if not named:
        return
    holders = ", ".join(sorted(named))
    if micro_batches > 1:
        raise SettingError(
            f"micro_batches={micro_batches} with state carried from batch to batch "
            f"(st.Carry in {holders}): the chunks of a batch run one after another, so "
            "each chunk's rows would start from the previous chunk's state, not their own "
            "— not what the whole batch computes. Use micro_batches=1; for less memory a step, "
            "make the windows shorter (a smaller bptt) and step over several with "
            "Options(accumulate=k): consecutive batches carry state as they should"
        )
    if world > 1:
        warnings.warn(
            f"the model carries state from batch to batch (st.Carry in {holders}), but "
            f"under DDP the {world} ranks take turns at the batches of the data (or at its "
            "rows, through a sampler), so a rank's state skips the other ranks' batches "
            "in between: not the sequence one process would carry it along. Train "
            "truncated backprop in one process, or give each rank consecutive windows of a "
            "stream of its own",
            UserWarning,
            stacklevel=outside(),
        )
        return
    how = _shuffled(train, shuffle)
    if how:
        warnings.warn(
            f"the model carries state from batch to batch (st.Carry in {holders}), but {how}, "
            "so each batch starts from the state of a batch that did not precede it. For "
            "truncated backprop keep the batches in order: Options(shuffle=False) for a "
            "list of batches, DataLoader(..., shuffle=False)",
            UserWarning,
            stacklevel=outside(),
        )


def _shuffled(train: Any, shuffle: bool) -> str:
    """How the training order is shuffled each epoch, or "" when it is read in order."""
    if isinstance(train, Sequence):
        return (
            "the Trainer shuffles the list of batches each epoch (Options(shuffle=True), the default)"
            if shuffle
            else ""
        )
    sampler = getattr(train, "sampler", None)
    if isinstance(sampler, RandomSampler):
        return "the DataLoader shuffles (shuffle=True: a RandomSampler)"
    batches = getattr(getattr(train, "batch_sampler", None), "sampler", None)
    for drawn in (sampler, batches):  # (a sampler of its own, or inside a batch_sampler)
        if isinstance(drawn, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)):
            return f"the DataLoader draws its rows in random order (a {type(drawn).__name__})"
    return ""


def check_last_batch(named: dict[str, Carry], data: Any, what: str) -> None:
    """A DataLoader whose last batch is short (``drop_last=False``, its dataset's length not a
    multiple of ``batch_size``): the state carried from the batch before has that batch's
    rows, and the RNN fails on the short one with a shape error naming no cause — at the
    end of an epoch, or of its evaluation. Warned when the run starts, naming the fix."""
    size = getattr(data, "batch_size", None)
    if not named or not isinstance(size, int) or getattr(data, "drop_last", True):
        return
    try:
        n = len(data.dataset)
    except (TypeError, AttributeError):  # (an iterable dataset: no length to tell)
        return
    if n % size:
        holders = ", ".join(sorted(named))
        warnings.warn(
            f"the model carries state from batch to batch (st.Carry in {holders}), but the "
            f"last batch of {what} has {n % size} rows, not {size} ({n} examples): the state "
            "carried into it has the rows of the batch before, so the model fails on it; "
            "pass DataLoader(..., drop_last=True), or a length that is a multiple of batch_size",
            UserWarning,
            stacklevel=outside(),
        )
