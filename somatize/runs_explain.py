"""Why a remembered call is, or is not, recalled: the part of its key that differs from the
nearest run of the same function in the store (``st.remember(...).explain``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .runkey import CallKey

if TYPE_CHECKING:
    from .runs import RunStore

__all__ = ["explain"]


def explain(store: RunStore, ck: CallKey, recalled: bool) -> str:
    """Why this call is (or is not) recalled: the key part that differs from the nearest run
    of the same function in ``store`` (its code, a helper, an argument, the versions)."""
    fn = ck.function.rsplit(".", 1)[-1]
    own = store.record(ck.key)
    if recalled:
        return f"recalled: {fn}({_args(ck.summary)}) finished before as run {ck.key[:12]}"
    if own is not None:
        status = own.get("status")
        why = {
            "done": "it finished, but its result is no longer in the keeper (evicted?)",
            "started": "it started and did not finish (killed?)",
            "unremembered": f"what it returned could not be kept ({own.get('error', '?')})",
        }.get(str(status), f"it raised: {own.get('error', '?')}")
        return (
            f"not recalled: run {ck.key[:12]} of {fn} has this key, but {why}; "
            "calling it again resumes from its last checkpoint"
        )
    same = [r for r in store.records() if r.get("function") == ck.function]
    if not same:
        return f"not recalled: no run of {ck.function} is remembered in {store.root}"
    # the fewest differing parts; among equals, the most recently used
    nearest, diffs = min(
        ((r, _diffs(r, ck)) for r in same), key=lambda p: (len(p[1]), -float(p[0]["used"]))
    )
    return (
        f"not recalled: the nearest run of {fn}, {str(nearest['key'])[:12]}, differs in "
        + "; ".join(diffs)
    )


def _diffs(r: Mapping[str, Any], ck: CallKey) -> list[str]:
    fn = ck.function.rsplit(".", 1)[-1]
    out = []
    if r.get("code") != ck.code:
        out.append(f"the code of {fn}")
    before, now = r.get("helpers", {}), ck.helpers
    for name in sorted(set(before) | set(now)):
        if name not in before:
            out.append(f"{fn} now reads {name!r}")
        elif name not in now:
            out.append(f"{fn} no longer reads {name!r}")
        elif before[name] != now[name]:
            kind = "helper" if now[name].startswith("code:") else "global"
            out.append(f"the {kind} {name!r} (its {'code' if kind == 'helper' else 'value'})")
    args, summary = r.get("args", {}), r.get("summary", {})
    for name in sorted(set(args) | set(ck.args)):
        if args.get(name) != ck.args.get(name):
            was, now_ = summary.get(name, "absent"), ck.summary.get(name, "absent")
            detail = f"{was} → {now_}" if was != now_ else f"{now_}, its content changed"
            out.append(f"argument {name!r} ({detail})")
    if r.get("versions") != ck.versions:
        out.append(f"the versions ({r.get('versions')} → {ck.versions})")
    return out or ["nothing it records (a run from another somatize?)"]


def _args(summary: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in summary.items())
