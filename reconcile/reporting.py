"""What a run leaves behind for the unattended case: `<state_dir>/last-run.json` and a Prometheus
textfile for node_exporter's textfile collector. Both are written atomically.

Called by the CLI's plan and apply commands. Counters (`*_total`) carry on from the previous
last-run.json (or, when the spec could not even be loaded, from the previous textfile).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from reconcile.host import atomic_write
from reconcile.metrics import OUTCOMES, RESULTS, previous_from_textfile, write_textfile

if TYPE_CHECKING:
    from reconcile.executing import ApplyReport
    from reconcile.loaded import LoadedSpec
    from reconcile.pausing import Pause
    from reconcile.plan import Plan

LAST_RUN = "last-run.json"
FORMAT = "reconcile-last-run/1"


@dataclass(frozen=True)
class RunFacts:
    """One plan or apply as the reports see it; `error` is set when it ended in a ReconcileError."""

    command: str  # plan | apply
    scheduled: bool
    started: float  # time.time()
    finished: float
    exit_code: int
    spec_path: str
    loaded: LoadedSpec | None = None
    plan: Plan | None = None  # plan: the plan; apply: the last plan (after the changes)
    first_plan: Plan | None = None
    report: ApplyReport | None = None
    paused: Pause | None = None
    error: str | None = None
    server_wanted: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


INTERRUPTED = "interrupted (SIGINT) before the end: not converged; run `reconcile apply` again"
EXIT_INTERRUPTED = 130


def outcome(f: RunFacts) -> str:
    if f.exit_code == EXIT_INTERRUPTED:
        return "interrupted"
    if f.error is not None:
        return "error"
    if f.paused is not None:
        return "paused"
    if f.report is not None and f.report.refused is not None:
        return "refused"
    if f.command == "apply":
        return {0: "converged", 2: "changed"}.get(f.exit_code, "failed")
    return {0: "converged", 2: "drift"}.get(f.exit_code, "failed")


def _server_healthy(plan: Plan | None) -> bool | None:
    if plan is None:
        return None
    health = plan.observed.get("health")
    if not isinstance(health, Mapping):
        return None
    return health.get("state") == "healthy"


def _resources(plan: Plan | None) -> list[dict[str, Any]]:
    from reconcile.rendering import plan_as_data

    if plan is None:
        return []
    data = plan_as_data(plan)
    return [
        {k: v for k, v in r.items() if k in ("resource", "status", "kind", "summary")}
        for r in data["resources"]
    ]


def _findings(plan: Plan | None) -> list[dict[str, str]]:
    if plan is None:
        return []
    return [
        {"rule": f.rule, "severity": f.severity, "message": f.message}
        for f in plan.findings
        if f.severity != "info"
    ]


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def build_record(f: RunFacts, previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The last-run.json document: what was found, what changed, results, durations, converged."""
    results = [asdict(r) for r in f.report.results] if f.report is not None else []
    counts = {r: sum(1 for x in results if x["result"] == r) for r in RESULTS}
    final = f.plan
    pending = [c.resource for c in final.changes] if final is not None else []
    failures = sum(counts[r] for r in ("failed", "blocked", "cannot-fix"))
    failures += len(final.errors) if final is not None else 0
    failures += 1 if f.error is not None or (f.report is not None and f.report.refused) else 0
    verdict = outcome(f)
    success = f.exit_code in (0, 2) and verdict != "error"
    old = (previous or {}).get("counters", {})
    counters = {
        "changes_total": {r: int(old.get("changes_total", {}).get(r, 0)) + counts[r] for r in RESULTS},
        "runs_total": {o: int(old.get("runs_total", {}).get(o, 0)) + (o == verdict) for o in OUTCOMES},
    }
    last_success = f.finished if success else (previous or {}).get("last_success_timestamp")
    git = final.git if final is not None else None
    return {
        "format": FORMAT,
        "command": f.command,
        "scheduled": f.scheduled,
        "host": socket.gethostname(),
        "spec": os.path.abspath(f.spec_path) if f.spec_path else None,
        "spec_sha256": f.loaded.sha256 if f.loaded is not None else None,
        "git": git,
        "started": _iso(f.started),
        "finished": _iso(f.finished),
        "timestamp": round(f.finished, 3),
        "duration_seconds": round(f.finished - f.started, 3),
        "exit_code": f.exit_code,
        "outcome": verdict,
        "converged": final is not None and not final.changes and f.error is None,
        "server_healthy": _server_healthy(final) if f.server_wanted else None,
        "paused": f.paused.as_data() if f.paused is not None else None,
        "error": f.error,
        "refused": f.report.refused if f.report is not None else None,
        "generation": f.report.generation if f.report is not None else None,
        "found": _resources(f.first_plan or final),
        "results": results,
        "result_counts": counts,
        "pending": pending,
        "findings": _findings(final),
        "failures": failures,
        "last_success_timestamp": last_success,
        "counters": counters,
        **dict(f.extra),
    }


def last_run_path(state_dir: str) -> str:
    return os.path.join(state_dir, LAST_RUN)


def read_last_run(state_dir: str) -> dict[str, Any] | None:
    try:
        with open(last_run_path(state_dir), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def write_last_run(state_dir: str, record: Mapping[str, Any]) -> str:
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    path = last_run_path(state_dir)
    atomic_write(path, (json.dumps(record, indent=2, default=str) + "\n").encode(), mode=0o644)
    return path


def report_run(f: RunFacts, textfile: str | None) -> dict[str, Any]:
    """Write last-run.json (when the spec's state_dir is known) and the textfile (when asked)."""
    state_dir = f.loaded.spec.machine.state_dir if f.loaded is not None else None
    previous = read_last_run(state_dir) if state_dir else None
    if previous is None and textfile:
        previous = previous_from_textfile(textfile)
    record = build_record(f, previous)
    if state_dir:
        write_last_run(state_dir, record)
        if f.plan is not None:  # the "since" times `reconcile status` shows (status writes nothing)
            from reconcile.conditions import record_conditions

            record_conditions(state_dir, f.plan)
    if textfile:
        write_textfile(textfile, record)
    return record
