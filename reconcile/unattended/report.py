"""What a run leaves behind for the unattended case: `<state_dir>/last-run.json` and a Prometheus
textfile for node_exporter's textfile collector. Both are written atomically.

Called by the CLI's plan and apply commands. Counters (`*_total`) carry on from the previous
last-run.json (or, when the spec could not even be loaded, from the previous textfile).
"""

from __future__ import annotations

import _socket  # not socket.py: its selectors and enums (~3-4 ms) for gethostname
import json
import os
import time
from collections.abc import Mapping
from types import MappingProxyType

from reconcile.host import atomic_write
from reconcile.plan.records import Result
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.filesafety import PRIVATE_DIR, PRIVATE_FILE, ensure_dir
from reconcile.unattended.metrics import OUTCOMES, RESULTS, previous_from_textfile, write_textfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.apply.changes import ApplyReport
    from reconcile.plan.records import Plan
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.unattended.pause import Pause

LAST_RUN = "last-run.json"
FORMAT = statefiles.LAST_RUN_FORMAT


class RunFacts(Record):
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
    extra: Mapping[str, Any] = MappingProxyType({})


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
    from reconcile.plan.render import plan_as_data

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
    results = [r.as_json() for r in f.report.results] if f.report is not None else []
    counts = {r: sum(1 for x in results if x["result"] == r) for r in RESULTS}
    final = f.plan
    pending = [c.resource for c in final.changes] if final is not None else []
    failures = sum(counts[r] for r in Result.FAILURES)
    failures += len(final.errors) if final is not None else 0
    failures += 1 if f.error is not None or (f.report is not None and f.report.refused) else 0
    verdict = outcome(f)
    success = f.exit_code in (0, 2) and verdict != "error"
    old = (previous or {}).get("counters") or {}
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
        "host": _socket.gethostname(),
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
        "phases": f.report.phases if f.report is not None else None,  # reconcile.apply.phases
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
    """The previous report, or None. One that is not what reconcile writes (not a file, bad JSON,
    another format, counters that are not counts) is moved aside as last-run.json.corrupt-<time>
    (reconcile.safety.statefiles): its counters are unusable anyway, and this run's report starts
    them afresh instead of failing on every run."""
    return statefiles.read_last_run(last_run_path(state_dir))


def write_last_run(state_dir: str, record: Mapping[str, Any]) -> str:
    ensure_dir(state_dir, PRIVATE_DIR)
    path = last_run_path(state_dir)
    raw = (json.dumps(record, indent=2, default=str) + "\n").encode()
    # Never a file its own reader moves aside at the next run: a last success of 1e400 carried from a
    # damaged textfile was written as Infinity, and every failing run after it left a .corrupt file
    # and started its counters afresh (twelfth round).
    problem = statefiles.unreadable(raw, max_bytes=statefiles.RECORD, shape=statefiles.LAST_RUN)
    if problem is not None:
        statefiles.note(f"state: {path} not written: {problem}")
        return path
    atomic_write(path, raw, mode=PRIVATE_FILE)
    return path


def report_run(f: RunFacts, textfile: str | None) -> dict[str, Any]:
    """Write last-run.json (when the spec's state_dir is known) and the textfile (when asked)."""
    state_dir = f.loaded.spec.machine.state_dir if f.loaded is not None else None
    previous = read_last_run(state_dir) if state_dir else None
    if previous is None and textfile:
        previous = previous_from_textfile(textfile)
    record = build_record(f, previous)
    if state_dir and (os.path.isdir(state_dir) or not os.path.lexists(state_dir)):
        write_last_run(state_dir, record)  # (a state_dir that is a file is the run's own error)
        if f.plan is not None:  # the "since" times `reconcile status` shows (status writes nothing)
            from reconcile.plan.conditions import record_conditions

            record_conditions(state_dir, f.plan)
    if textfile:
        write_textfile(textfile, record)
    return record
