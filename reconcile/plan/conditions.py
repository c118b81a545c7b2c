"""Conditions per resource (ok / drift / failed, with since when), like Kubernetes' lastTransitionTime.

`<state_dir>/conditions.json` keeps the transition times; it is written by the runs that already write
last-run.json (reconcile.unattended.report), and only read by `reconcile status`, which writes nothing
(but moves a damaged one aside, as every reader of state does: reconcile.safety.statefiles).
"""

from __future__ import annotations

import json
import os
import time

from reconcile.host import atomic_write
from reconcile.plan.records import Change, Plan
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.filesafety import PRIVATE_DIR, PRIVATE_FILE, ensure_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Condition(Record):
    resource: str
    status: str  # ok | drift | failed
    reason: str
    since: float


def conditions_path(state_dir: str) -> str:
    return os.path.join(state_dir, "conditions.json")


def _previous(state_dir: str) -> dict[str, Any]:
    """The transition times kept; {} when none, or when the file was damaged (moved aside)."""
    return statefiles.read_conditions(conditions_path(state_dir))


def conditions_of(plan: Plan, previous: dict[str, Any], now: float) -> list[Condition]:
    """Conditions from a plan; `since` is kept from the previous record while the status holds."""
    out: list[Condition] = []
    for item in plan.items:
        status = ("drift" if item.will_change else "failed") if isinstance(item, Change) else "ok"
        old = previous.get(item.resource) or {}
        since = float(old["since"]) if old.get("status") == status else now
        out.append(Condition(item.resource, status, item.summary, since))
    return out


def read_conditions(state_dir: str, plan: Plan, *, now: float | None = None) -> list[Condition]:
    """What `reconcile status` shows: nothing is written (a status that differs from the last run's
    record shows since now)."""
    return conditions_of(plan, _previous(state_dir), time.time() if now is None else now)


def record_conditions(state_dir: str, plan: Plan, *, now: float | None = None) -> list[Condition]:
    """Update conditions.json from a run's final plan (written only when a status changed)."""
    previous = _previous(state_dir)
    out = conditions_of(plan, previous, time.time() if now is None else now)
    record = {c.resource: {"status": c.status, "since": c.since} for c in out}
    old = {k: {"status": v["status"], "since": v["since"]} for k, v in previous.items()}
    if record != old:
        ensure_dir(state_dir, PRIVATE_DIR)
        atomic_write(
            conditions_path(state_dir), (json.dumps(record, indent=2) + "\n").encode(), mode=PRIVATE_FILE
        )
    return out
