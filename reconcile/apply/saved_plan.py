"""A plan saved by `reconcile plan --out FILE`, and what `reconcile apply FILE` checks against it: the
plan made under the lock must be exactly the saved one (Terraform's saved plans).

Called by the CLI's plan command (save_plan) and the executor (read_plan_file, moved_since).
"""

from __future__ import annotations

import json
import os

from reconcile.errors import ReconcileError
from reconcile.host import atomic_write
from reconcile.plan.records import Plan
from reconcile.safety.untrusted import load_json
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def fingerprint(plan: Plan) -> dict[str, Any]:
    """What a saved plan promises: each change's resource, kind and field diffs."""
    return {
        "spec_sha256": plan.spec_sha256,
        "changes": [
            {"resource": c.resource, "kind": c.kind, "diffs": [[d.field, d.old, d.new] for d in c.diffs]}
            for c in plan.changes
        ],
    }


def _moved(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What differs between a saved plan and the plan of now, in words (None: nothing)."""
    if saved.get("spec_sha256") != now["spec_sha256"]:
        return "the spec changed"
    then = {c["resource"]: c for c in saved.get("changes") or []}
    current = {c["resource"]: c for c in now["changes"]}
    if then == current and list(then) == list(current):
        return None
    moved = []
    for resource in [*then, *(r for r in current if r not in then)]:
        a, b = then.get(resource), current.get(resource)
        if a is None:
            moved.append(f"{resource}: not planned, now {b and b['kind']}")
        elif b is None:
            moved.append(f"{resource}: planned {a['kind']}, now already true")
        elif a != b:
            moved.append(f"{resource}: planned {a['kind']} {_fields(a)}, now {b['kind']} {_fields(b)}")
    return "the machine changed (" + "; ".join(moved or ["the order of the Changes"]) + ")"


def _fields(c: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{d[0]}: {d[1]} -> {d[2]}" for d in c.get("diffs") or []) + "}"


def save_plan(plan: Plan, loaded: LoadedSpec, path: str) -> None:
    body = {"format": "reconcile-plan/1", "spec_path": os.path.abspath(loaded.path), **fingerprint(plan)}
    atomic_write(path, (json.dumps(body, indent=2, default=str) + "\n").encode(), mode=0o644)


FIX = (
    "a plan file names the spec `apply FILE` runs, so reconcile reads one only when root or the user "
    "running it owns it and every directory above it, and nobody else can write them: save the plan "
    "under a directory only root can write"
)


def read_plan_file(path: str) -> tuple[str, dict[str, Any]]:
    """(the spec's path, the saved fingerprint) of a plan file, or one clear error."""
    from reconcile.spec.provenance import read_trusted

    try:  # it names the spec root applies: held to the spec's own rule (issue 24, class 3)
        raw = read_trusted(path, path, missing_ok=True, fix=FIX)
        if raw is None:
            raise ReconcileError(f"{path}: no such plan file (make one with `reconcile plan --out {path}`)")
        saved = load_json(raw)
        spec_path = saved["spec_path"]
    except (ValueError, KeyError, TypeError):
        raise ReconcileError(f"{path}: not a plan file written by `reconcile plan --out`") from None
    expected = {"spec_sha256": saved.get("spec_sha256"), "changes": saved.get("changes")}
    # JSON turns tuples into lists; compare in the same shape.
    return str(spec_path), json.loads(json.dumps(expected, default=str))


def moved_since(expected: dict[str, Any], plan: Plan) -> str | None:
    """What differs between a saved plan's fingerprint and the plan of now, in words (None: nothing)."""
    return _moved(expected, json.loads(json.dumps(fingerprint(plan), default=str)))
