"""`reconcile apply`: lock, run each Change in dependency order between two re-probes, re-plan.

Called by the CLI (apply, rollback). Actions are reached only through `reconcile.dispatch`;
what to do is decided by the planner, re-decided right before each action runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from reconcile.errors import ReconcileError
from reconcile.host import checkpoint
from reconcile.loading import load_spec
from reconcile.plan import Change, Plan
from reconcile.spec import LoadedSpec
from reconcile.state import apply_lock, sweep_stale_temps, write_generation

ProgressFn = Callable[[str], None]


@dataclass
class ChangeResult:
    resource: str
    kind: str
    summary: str
    result: str  # changed | already-true | failed | blocked | cannot-fix
    message: str
    seconds: float
    diffs: list[list[Any]] = field(default_factory=list)  # [field, old, new] of the Change that ran


@dataclass
class ApplyReport:
    spec_path: str
    results: list[ChangeResult] = field(default_factory=list)
    first_plan: Plan | None = None
    final_plan: Plan | None = None
    notes: list[str] = field(default_factory=list)
    generation: int | None = None
    refused: str | None = None  # why nothing ran (preflight error, stale plan file)
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return any(r.result == "changed" for r in self.results)

    @property
    def converged(self) -> bool:
        return self.final_plan is not None and not self.final_plan.changes

    @property
    def exit_code(self) -> int:
        """Puppet's --detailed-exitcodes: 0 nothing to do, 2 changed+converged, 1 refused, 4 failed."""
        if self.refused is not None:
            return 1
        if any(r.result in ("failed", "blocked", "cannot-fix") for r in self.results) or not self.converged:
            return 4
        return 2 if self.changed else 0


def _blocked_by(change: Change, failed: set[str]) -> str | None:
    for dep in change.depends_on:
        if dep in failed:
            return dep
    return None


def _run_change(
    loaded: LoadedSpec, change: Change, progress: ProgressFn, fresh: Change | None = None
) -> ChangeResult:
    """Re-probe (unless `fresh` is that re-probe's answer), act, re-probe: the resource must now match."""
    from reconcile import dispatch
    from reconcile.planning import replan_resource

    started = time.monotonic()

    def done(result: str, message: str, c: Change = change) -> ChangeResult:
        diffs = [[d.field, d.old, d.new] for d in c.diffs]
        return ChangeResult(c.resource, c.kind, c.summary, result, message, time.monotonic() - started, diffs)

    if fresh is None:
        fresh = replan_resource(loaded, change.resource)
    if fresh is None:
        return done("already-true", "already as the spec says (re-probed before acting)")
    if not fresh.actionable:
        return done("cannot-fix", fresh.reason or fresh.summary, fresh)
    progress(f"{fresh.kind} {fresh.resource}: {fresh.summary}")
    checkpoint(f"before:{fresh.resource}")
    try:
        outcome = dispatch.perform(loaded, fresh, progress)
    except ReconcileError as exc:  # ActionError, and a RetryableError whose retries ran out
        return done("failed", str(exc), fresh)
    except Exception as exc:  # a bug in an action must not hide what the other Changes did
        return done("failed", f"the action crashed: {type(exc).__name__}: {exc} (a bug)", fresh)
    checkpoint(f"after:{fresh.resource}")
    after = replan_resource(loaded, change.resource)
    if after is not None:
        return done("failed", f"{outcome.message}; but a re-probe still finds: {after.summary}", fresh)
    return done("changed" if outcome.changed else "already-true", outcome.message, fresh)


def _execute(
    loaded: LoadedSpec, report: ApplyReport, plan: Plan, progress: ProgressFn, *, exact: bool
) -> None:
    """Each planned Change in order; after a change, also re-plan the resources the plan found true,
    since what changed may move them (unless `exact`: a saved plan runs its own Changes only)."""
    from reconcile.planning import replan_resource

    failed: set[str] = set()
    for item in plan.items:
        fresh: Change | None = None
        if isinstance(item, Change):
            change = item
        elif exact or not report.changed:
            continue
        else:
            fresh = replan_resource(loaded, item.resource)
            if fresh is None:
                continue
            change = fresh
        dep = _blocked_by(change, failed)
        if dep is not None:
            report.results.append(
                ChangeResult(change.resource, change.kind, change.summary, "blocked", f"{dep} failed", 0.0,
                             [[d.field, d.old, d.new] for d in change.diffs])
            )
            failed.add(change.resource)
            continue
        result = _run_change(loaded, change, progress, fresh)
        report.results.append(result)
        if result.result in ("failed", "cannot-fix"):
            failed.add(change.resource)


def apply_spec(
    loaded: LoadedSpec,
    *,
    lock_timeout: float,
    rollback_of: int | None = None,
    expected: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> ApplyReport:
    """Lock, plan, run the plan's Changes, plan again; a generation is written when something changed.

    `expected` (a saved plan's fingerprint): refuse unless the plan made now is exactly that one.
    """
    from reconcile.planning import make_plan

    show = progress or _stderr_progress
    started = time.monotonic()
    report = ApplyReport(loaded.path)
    state_dir = loaded.spec.machine.state_dir

    def waiting(holder: str) -> None:
        show(f"waiting up to {lock_timeout:g}s for the apply lock, held by {holder}")

    with apply_lock(state_dir, timeout=lock_timeout, on_wait=waiting) as lock:
        if lock.took_over:
            report.notes.append(f"took over the lock left by {lock.took_over.describe()}, which is gone")
        checkpoint("apply.locked")
        plan = make_plan(loaded)
        report.first_plan = plan
        if plan.errors:
            report.refused = f"{len(plan.errors)} preflight error(s); nothing was changed"
            report.final_plan = plan
            return report
        if expected is not None:
            moved = _moved(expected, json.loads(json.dumps(_fingerprint(plan), default=str)))
            if moved:
                report.refused = (
                    f"{moved} since the plan file was made; nothing was changed "
                    "(make a new one with `reconcile plan --out FILE`)"
                )
                report.final_plan = plan
                return report
        swept = sweep_stale_temps(loaded.spec)
        if swept:
            report.notes.append(f"removed {len(swept)} temp file(s) a killed apply left: {', '.join(swept)}")
        _execute(loaded, report, plan, show, exact=expected is not None)
        checkpoint("apply.executed")
        report.final_plan = make_plan(loaded) if report.results else plan
        report.seconds = time.monotonic() - started
        if report.changed:
            report.generation = _record(loaded, report, rollback_of)
    return report


def _fingerprint(plan: Plan) -> dict[str, Any]:
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
    from reconcile.host import atomic_write

    body = {"format": "reconcile-plan/1", "spec_path": os.path.abspath(loaded.path), **_fingerprint(plan)}
    atomic_write(path, (json.dumps(body, indent=2, default=str) + "\n").encode(), mode=0o644)


def apply_plan_file(path: str, *, lock_timeout: float) -> ApplyReport:
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        spec_path = saved["spec_path"]
    except FileNotFoundError:
        raise ReconcileError(
            f"{path}: no such plan file (make one with `reconcile plan --out {path}`)"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise ReconcileError(f"{path}: not a plan file written by `reconcile plan --out`") from None
    loaded = load_spec(spec_path)
    expected = {"spec_sha256": saved.get("spec_sha256"), "changes": saved.get("changes")}
    # JSON turns tuples into lists; compare in the same shape.
    expected = json.loads(json.dumps(expected, default=str))
    return apply_spec(loaded, lock_timeout=lock_timeout, expected=expected)


def _record(loaded: LoadedSpec, report: ApplyReport, rollback_of: int | None) -> int:
    from reconcile.planning import resolved_versions
    from reconcile.state import git_info

    git = git_info(loaded.files)
    record = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "spec_path": os.path.abspath(loaded.path),
        "spec_sha256": loaded.sha256,
        "spec_text": loaded.text,
        "spec_resolved": loaded.resolved,
        "git": git.describe(),
        "git_commit": git.commit,
        "git_dirty": git.dirty,
        "rollback_of": rollback_of,
        "resolved": resolved_versions(loaded),
        "changes": [dataclasses.asdict(r) for r in report.results],
        "converged": report.converged,
        "seconds": round(report.seconds, 3),
    }
    return write_generation(loaded.spec.machine.state_dir, record)


def _stderr_progress(line: str) -> None:
    print(f"  … {line}", file=sys.stderr, flush=True)


_RESULT_SYMBOL = {"changed": "✓", "already-true": "·", "failed": "✗", "blocked": "⊘", "cannot-fix": "!"}


def render_report(report: ApplyReport, stream: TextIO, *, as_json: bool, quiet: bool) -> None:
    from reconcile.rendering import plan_as_data, render_text

    if as_json:
        data = {
            "spec": report.spec_path,
            "exit_code": report.exit_code,
            "refused": report.refused,
            "converged": report.converged,
            "generation": report.generation,
            "notes": report.notes,
            "results": [dataclasses.asdict(r) for r in report.results],
            "final_plan": plan_as_data(report.final_plan) if report.final_plan else None,
            "seconds": round(report.seconds, 3),
        }
        json.dump(data, stream, indent=2, default=str)
        stream.write("\n")
        return
    for note in report.notes:
        stream.write(f"note: {note}\n")
    if report.refused is not None:
        if report.final_plan is not None:
            render_text(report.final_plan, stream, title="apply (refused)")
        stream.write(f"apply refused: {report.refused}\n")
        return
    if not report.results:
        if quiet:
            stream.write(f"reconcile: {report.spec_path}: converged, nothing to do\n")
        elif report.final_plan is not None:
            render_text(report.final_plan, stream, title="apply", verbose_info=False)
        return
    stream.write(f"reconcile apply · {report.spec_path}\n\n")
    for r in report.results:
        stream.write(f"  {_RESULT_SYMBOL.get(r.result, '?')} {r.resource:<16} {r.result}: {r.message} "
                     f"({r.seconds:.1f}s)\n")
    stream.write("\n")
    if report.final_plan is not None and report.final_plan.changes:
        stream.write("Still different from the spec after apply:\n")
        render_text(report.final_plan, stream, title="plan after apply", verbose_info=False)
    gen = f", generation {report.generation}" if report.generation else ""
    verdict = "converged" if report.converged else "NOT converged"
    stream.write(f"Apply {verdict} in {report.seconds:.1f}s{gen}.\n")
