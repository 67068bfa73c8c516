"""What the caller of a distributed run checks: the transports it was given, the replies
they send back, and the values that cannot change host (``CrossingError`` naming the edge
and the hosts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from .errors import CrossingError, TransportError

if TYPE_CHECKING:
    from .transports import Job, Reply

__all__ = ["check_transport", "checked", "crossing"]


def crossing(
    slot: str | None, source: str, readers: Sequence[tuple[str | None, str]]
) -> CrossingError:
    """The error for an Opaque value that would leave its process; names edge and hosts."""
    reader, target = readers[0]
    what = "the graph input" if slot is None else f"the output of node {slot!r}"
    fix = "pass data (a detached tensor)" if slot is None else f"return data from {slot!r}"
    if reader is None:
        return CrossingError(
            f"{what} is Opaque and cannot cross from host {source!r} to host {target!r} as the "
            f"graph's output: an Opaque value exists only in the process that made it — {fix}"
        )
    edge = f"{'input' if slot is None else repr(slot)} -> {reader!r}"
    if source == target:
        return CrossingError(
            f"{what} on host {source!r} is Opaque, but node {reader!r} reads it in a later slice "
            f"on that host (edge {edge}); values leave a slice encoded — {fix}, or place the "
            f"nodes that run between them on {source!r} so one slice holds both"
        )
    return CrossingError(
        f"{what} is Opaque and cannot cross from host {source!r} to host {target!r} (edge "
        f"{edge}): an Opaque value exists only in the process that made it — {fix}, or place "
        f"{reader!r} on host {source!r}"
    )


def check_transport(host: str, transport: object) -> None:
    """A ``TypeError`` naming ``host`` and the fix where ``transport`` is not a transport."""
    if isinstance(transport, type):
        raise TypeError(
            f"transports[{host!r}] is the class {transport.__qualname__}; pass a transport "
            f"object: {transport.__qualname__}() (or ExecutorTransport(executor))"
        )
    if not callable(getattr(transport, "run", None)):
        raise TypeError(
            f"transports[{host!r}] is a {type(transport).__qualname__}, not a transport (an "
            "object with run(job, code)); pass ExecutorTransport(executor) — for Dask, "
            "ExecutorTransport(client.get_executor(workers=[name])) — or InProcess()"
        )


_REPLY = {"outputs": dict, "opaque": list, "metrics": bytes, "events": bytes}


def checked(reply: Any, transport: object, job: Job) -> Reply:
    """``reply``, once it has the shape of a ``Reply`` with every output ``job`` asks for; else
    a ``TransportError`` naming the transport, the slice and what is wrong."""
    where = f"{job['name']}: {type(transport).__qualname__}.run"
    if not isinstance(reply, dict):
        why = f"returned {type(reply).__qualname__ if reply is not None else None}, not a Reply"
    elif missing := [k for k in _REPLY if k not in reply]:
        why = f"replied without {', '.join(map(repr, missing))}"
    elif bad := [k for k, t in _REPLY.items() if not isinstance(reply[k], t)]:
        why = f"replied with {bad[0]!r} a {type(reply[bad[0]]).__qualname__}"
    elif lacking := [n for n in job["outputs"] if n not in reply["outputs"]]:
        if set(reply["opaque"]) & set(lacking):
            return cast("Reply", reply)  # (an Opaque output: the caller names the crossing)
        why = f"replied with no output of node {lacking[0]!r}"
    elif odd := [n for n, v in reply["outputs"].items() if not isinstance(v, bytes)]:
        kind = type(reply["outputs"][odd[0]]).__qualname__
        why = f"replied with the output of node {odd[0]!r} a {kind}, not bytes"
    else:
        return cast("Reply", reply)
    raise TransportError(
        f"{where} {why}: a transport returns a Reply — {{'outputs': {{node: encoded bytes}}, "
        "'opaque': [...], 'metrics': bytes, 'events': bytes}, as serve() or InProcess().run "
        "make it"
    )
