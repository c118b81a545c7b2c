"""Running a plan's Changes: lock, each Change in dependency order between two re-probes, re-plan.

Called by reconcile.apply.executor (apply), switching (rollback) and `apply FILE`. Actions are reached
only through the resources' declarations (`Kind.perform`); what to do is decided by the planner,
re-decided right before each runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable

from reconcile.apply import phases
from reconcile.apply.journal import write_generation
from reconcile.apply.lock import apply_lock, sweep_stale_temps
from reconcile.apply.saved_plan import moved_since, read_plan_file
from reconcile.errors import ActionError, ReconcileError
from reconcile.host import checkpoint
from reconcile.plan.records import Change, Plan, Result
from reconcile.record import Record
from reconcile.safety.filesafety import walked_once
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

ProgressFn = Callable[[str], None]


class ChangeResult(Record):
    resource: str
    kind: str
    summary: str
    result: str  # changed | already-true | failed | blocked | cannot-fix
    message: str
    seconds: float
    diffs: tuple[tuple[str, Any, Any], ...] = ()  # (field, old, new) of the Change that ran

    def as_json(self) -> dict[str, Any]:
        """As the apply report, the generation record and last-run.json spell it (diffs as lists)."""
        return {**self._asdict(), "diffs": [list(d) for d in self.diffs]}


class ApplyReport:
    """What one apply did; the executor fills it in as it goes."""

    def __init__(
        self,
        spec_path: str,
        results: list[ChangeResult] | None = None,
        first_plan: Plan | None = None,
        final_plan: Plan | None = None,
        notes: list[str] | None = None,
        generation: int | None = None,
        journal: int | None = None,
        refused: str | None = None,  # why nothing ran (preflight error, stale plan file)
        seconds: float = 0.0,
        paused: Any = None,  # reconcile.unattended.pause.Pause: a scheduled apply that only planned
    ) -> None:
        self.spec_path = spec_path
        self.results: list[ChangeResult] = [] if results is None else results
        self.first_plan = first_plan
        self.final_plan = final_plan
        self.notes: list[str] = [] if notes is None else notes
        self.generation = generation  # the generation this apply made current (reconcile.apply.generations)
        self.journal = journal  # this apply's own record (reconcile.apply.journal)
        self.interrupted: str | None = None  # what a Ctrl-C or SIGTERM during the switch left, in words
        self.refused = refused
        self.seconds = seconds
        self.paused = paused
        self.phases: dict[str, float] = {}  # each phase of the run and its seconds (reconcile.apply.phases)

    @property
    def changed(self) -> bool:
        return any(r.result == Result.CHANGED for r in self.results)

    @property
    def converged(self) -> bool:
        return self.final_plan is not None and not self.final_plan.changes

    @property
    def exit_code(self) -> int:
        """Puppet's --detailed-exitcodes: 0 nothing to do, 2 changed+converged, 1 refused, 4 failed."""
        if self.paused is not None:
            return 0  # held off on purpose; the report says by whom
        if self.refused is not None:
            return 1
        if any(r.result in Result.FAILURES for r in self.results) or not self.converged:
            return 4
        return 2 if self.changed else 0


def _blocked_by(change: Change, failed: dict[str, str]) -> str | None:
    """Why `change` cannot run: the first of its dependencies that failed (its root cause), or None."""
    for dep in change.depends_on:
        if dep in failed:
            return failed[dep]
    return None


def _run_change(
    loaded: LoadedSpec, change: Change, progress: ProgressFn, fresh: Change | None = None
) -> ChangeResult:
    """Re-probe (unless `fresh` is that re-probe's answer), act, re-probe: the resource must now match."""
    from reconcile.plan.planner import replan_resource
    from reconcile.resources import BY_NAME

    started = time.monotonic()

    def done(result: str, message: str, c: Change = change) -> ChangeResult:
        diffs = tuple((d.field, d.old, d.new) for d in c.diffs)
        return ChangeResult(c.resource, c.kind, c.summary, result, message, time.monotonic() - started, diffs)

    if fresh is None:
        fresh = replan_resource(loaded, change.resource)
    if fresh is None:
        return done(Result.ALREADY_TRUE, "already as the spec says (re-probed before acting)")
    if not fresh.actionable:
        return done(Result.CANNOT_FIX, fresh.reason or fresh.summary, fresh)
    progress(f"{fresh.kind} {fresh.resource}: {fresh.summary}")
    checkpoint(f"before:{fresh.resource}")
    try:
        action = BY_NAME[fresh.resource].perform
        if action is None:  # the planner made an actionable Change for a resource apply cannot act on
            raise ActionError(f"no action for resource {fresh.resource!r} (a bug)")
        outcome = action(loaded, fresh, progress)
    except ReconcileError as exc:  # ActionError, and a RetryableError whose retries ran out
        return done(Result.FAILED, str(exc), fresh)
    except OSError as exc:  # the machine said no: a full disk, a read-only or forbidden path
        where = f" ({exc.filename})" if exc.filename else ""
        hint = {28: "free some space", 30: "the filesystem is read-only", 13: "check the owner and mode"}
        fix = hint.get(exc.errno or 0)
        return done(
            Result.FAILED,
            f"{exc.strerror or exc}{where}" + (f": {fix}, then apply again" if fix else ""),
            fresh,
        )
    except Exception as exc:  # a bug in an action must not hide what the other Changes did
        return done(Result.FAILED, f"the action crashed: {type(exc).__name__}: {exc} (a bug)", fresh)
    checkpoint(f"after:{fresh.resource}")
    after = replan_resource(loaded, change.resource)
    if after is not None:
        return done(Result.FAILED, f"{outcome.message}; but a re-probe still finds: {after.summary}", fresh)
    return done(Result.CHANGED if outcome.changed else Result.ALREADY_TRUE, outcome.message, fresh)


def _execute(
    loaded: LoadedSpec,
    report: ApplyReport,
    plan: Plan,
    progress: ProgressFn,
    *,
    exact: bool,
    after_each: Callable[[], None],
) -> None:
    """Each planned Change in order; after a change, also re-plan the resources the plan found true,
    since what changed may move them (unless `exact`: a saved plan runs its own Changes only)."""
    from reconcile.plan.planner import replan_resource
    from reconcile.resources import BY_NAME

    began = time.monotonic()
    failed: dict[str, str] = {}  # resource -> the root failure that stops what depends on it
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
        cause = _blocked_by(change, failed)
        if cause is not None:
            report.results.append(
                ChangeResult(
                    change.resource,
                    change.kind,
                    change.summary,
                    Result.BLOCKED,
                    cause,
                    0.0,
                    tuple((d.field, d.old, d.new) for d in change.diffs),
                )
            )
            failed[change.resource] = cause
            after_each()
            continue
        prepared = time.monotonic() - began
        result = _run_change(loaded, change, progress, fresh)
        if BY_NAME[change.resource].serves and result.result == Result.CHANGED:
            # Everything the new server reads ran before this row (the table's order): the old one
            # served while it did, and is asked to stop only now.
            result = result._replace(message=f"prepared in {prepared:.1f}s, then {result.message}")
        report.results.append(result)
        if result.result == Result.FAILED:
            failed[change.resource] = f"{change.resource} failed"
        elif result.result == Result.CANNOT_FIX:
            failed[change.resource] = f"{change.resource} is not as the spec says, and apply cannot fix it"
        after_each()


def apply_spec(
    loaded: LoadedSpec,
    *,
    lock_timeout: float,
    rollback_of: int | None = None,
    expected: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    scheduled: bool = False,
    exact: bool | None = None,
    on_locked: Callable[[ApplyReport], None] | None = None,
    on_done: Callable[[ApplyReport], None] | None = None,
    on_interrupt: Callable[[ApplyReport], None] | None = None,
) -> ApplyReport:
    """Lock, plan, run the plan's Changes, plan again; a generation is written when something changed.

    `expected` (a saved plan's fingerprint): refuse unless the plan made now is exactly that one.
    `scheduled` (the timer's run): while `reconcile pause` holds, only plan.
    `exact` (default: when `expected`): run the plan's own Changes only; an approved plan is not exact.
    `on_locked` / `on_done` / `on_interrupt` (reconcile.apply.switching): run under the lock before
    the first plan / at the end / when a KeyboardInterrupt (Ctrl-C, or SIGTERM made one) stops it.
    """
    from reconcile.plan.planner import make_plan, remember
    from reconcile.plan.prober import probe_all
    from reconcile.unattended.pause import read_pause

    show = progress or _stderr_progress
    phases.lap("setup")  # since the caller's last phase: the spec held or rolled back to, approval
    started = time.monotonic()
    report = ApplyReport(loaded.path)
    state_dir = loaded.spec.machine.state_dir
    held = read_pause(state_dir)
    if held is not None and scheduled:
        # Plan only, without the lock (the person debugging may hold it), and say who paused.
        report.paused = held
        report.first_plan = report.final_plan = make_plan(loaded)
        report.seconds = time.monotonic() - started
        phases.lap("plan")
        report.phases = phases.taken()
        return report
    if held is not None:
        report.notes.append(f"scheduled applies are {held.describe()}; this apply runs anyway")

    def waiting(holder: str) -> None:
        show(f"waiting up to {lock_timeout:g}s for the apply lock, held by {holder}")

    # Under the lock, a tree the path rule walked whole (a site-packages) is walked once, not by each plan.
    with apply_lock(state_dir, timeout=lock_timeout, on_wait=waiting) as lock, walked_once():
        if lock.took_over:
            report.notes.append(f"took over the lock left by {lock.took_over.describe()}, which is gone")
        checkpoint("apply.locked")
        phases.lap("lock")
        if on_locked is not None:
            on_locked(report)
            phases.lap("prepare")
        observed = probe_all(loaded.spec)
        plan = make_plan(loaded, observed)
        report.first_plan = plan
        try:  # what spans runs (an engine stall); a state dir that cannot be written must not stop apply
            remember(loaded.spec, observed)
        except (OSError, ReconcileError) as exc:
            report.notes.append(f"could not keep the run's observations: {exc}")
        phases.lap("plan")
        if plan.errors:
            report.refused = f"{len(plan.errors)} preflight error(s); nothing was changed"
            report.final_plan = plan
            report.phases = phases.taken()
            return report
        if expected is not None:
            moved = moved_since(expected, plan)
            if moved:
                report.refused = (
                    f"{moved} since the plan file was made; nothing was changed "
                    "(make a new one with `reconcile plan --out FILE`)"
                )
                report.final_plan = plan
                report.phases = phases.taken()
                return report
        swept = sweep_stale_temps(loaded.spec)
        if swept:
            report.notes.append(f"removed {len(swept)} temp file(s) a killed apply left: {', '.join(swept)}")

        written: dict[str, Any] = {}  # the complete record as last written

        def record(complete: bool) -> None:
            # As soon as something changed, after each Change, and complete at the end: a killed
            # apply leaves its record. A record that cannot be written must not hide what changed.
            if not report.changed:
                return
            report.seconds = time.monotonic() - started
            try:
                report.journal = _record(loaded, report, rollback_of, complete=complete, written=written)
            except (OSError, ReconcileError) as exc:
                note = f"could not write the generation record: {exc}"
                if note not in report.notes:
                    report.notes.append(note)

        try:
            _execute(
                loaded,
                report,
                plan,
                show,
                exact=expected is not None if exact is None else exact,
                after_each=lambda: record(False),
            )
            checkpoint("apply.executed")
            phases.lap("changes")
            report.final_plan = plan
            if report.results:
                try:
                    report.final_plan = make_plan(loaded)
                except Exception as exc:  # things changed: report them; not knowing the result is exit 4
                    report.final_plan = None
                    report.notes.append(f"the plan after apply failed: {type(exc).__name__}: {exc}")
                phases.lap("final plan")
            record(True)
            phases.lap("journal")
            if on_done is not None:
                on_done(report)
            report.phases = phases.taken()
            if written and report.journal is not None:  # the record again, with the phases after it
                with contextlib.suppress(OSError, ReconcileError):
                    write_generation(state_dir, {**written, "phases": report.phases}, report.journal)
        except KeyboardInterrupt:
            if on_interrupt is not None:
                on_interrupt(report)
            raise
        report.seconds = time.monotonic() - started
    return report


def plan_file_spec(path: str) -> tuple[LoadedSpec, dict[str, Any]]:
    """The spec a plan saved in `path` (by `reconcile plan --out`) was made of, at its realization,
    and the plan's fingerprint: reconcile.apply.executor runs exactly that plan, or refuses."""
    from reconcile.spec.cache import load
    from reconcile.spec.pins import apply_lock_pins

    spec_path, expected = read_plan_file(path)
    from reconcile.apply.store import realize

    loaded = realize(apply_lock_pins(load(spec_path)))  # as the plan was made: at its realization
    return loaded, expected


def _record(
    loaded: LoadedSpec,
    report: ApplyReport,
    rollback_of: int | None,
    *,
    complete: bool,
    written: dict[str, Any],
) -> int:
    """Write this apply's generation (again): `complete` once the final plan is made; before that,
    after each Change, without the resolved versions (probing them each time would cost). The
    complete record is left in `written` (the phases are added to it once the switch is judged)."""
    from reconcile.plan.planner import resolved_versions
    from reconcile.spec.origin import git_info
    from reconcile.spec.pins import used_pins

    git = git_info(loaded.files)
    resolved = resolved_versions(loaded) if complete else {}
    if complete and (pins := used_pins(loaded)) is not None:
        resolved["lock"] = pins  # what the lock pinned, beside what the venv and model dir hold
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
        "resolved": resolved,
        "changes": [r.as_json() for r in report.results],
        "converged": report.converged,
        "complete": complete,  # false: the apply (pid) was still running, or was killed
        "pid": os.getpid(),
        "seconds": round(report.seconds, 3),
        "phases": phases.taken(),
    }
    if complete:
        written.clear()
        written.update(record)
    return write_generation(loaded.spec.machine.state_dir, record, report.journal)


def _stderr_progress(line: str) -> None:
    print(f"  … {line}", file=sys.stderr, flush=True)


_RESULT_SYMBOL = {
    Result.CHANGED: "✓",
    Result.ALREADY_TRUE: "·",
    Result.FAILED: "✗",
    Result.BLOCKED: "⊘",
    Result.CANNOT_FIX: "!",
}


def render_report(report: ApplyReport, stream: TextIO, *, as_json: bool, quiet: bool) -> None:
    from reconcile.plan.render import render_text

    if as_json:
        from reconcile.plan.jsondata import apply_as_data

        data = apply_as_data(report)
        json.dump(data, stream, indent=2, default=str)
        stream.write("\n")
        return
    for note in report.notes:
        stream.write(f"note: {note}\n")
    if report.paused is not None:
        if report.final_plan is not None and (report.final_plan.changes or not quiet):
            render_text(report.final_plan, stream, title="apply (paused: plan only)", verbose_info=False)
        stream.write(
            f"reconcile: {report.spec_path}: not applied: {report.paused.describe()} "
            "(`reconcile resume` ends it)\n"
        )
        return
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
    first = report.first_plan
    stream.write(f"reconcile apply · {report.spec_path}" + (f" · {first.git}" if first else "") + "\n\n")
    for note in first.notes if first else ():  # the spec's git state, lock and pause notes
        stream.write(f"  note: {note}\n")
    for r in report.results:
        stream.write(
            f"  {_RESULT_SYMBOL.get(r.result, '?')} {r.resource:<16} {r.result}: {r.message} "
            f"({r.seconds:.1f}s)\n"
        )
    if report.phases:
        stream.write(f"  phases: {phases.describe(report.phases)}\n")
    stream.write("\n")
    if report.final_plan is not None and report.final_plan.changes:
        stream.write("Still different from the spec after apply:\n")
        render_text(report.final_plan, stream, title="plan after apply", verbose_info=False)
    gen = f", generation {report.generation}" if report.generation else ""
    verdict = "converged" if report.converged else "NOT converged"
    # A plan can converge while a step failed (an acceptance check, with or without the rollback):
    # the last line says so, as the exit code (4) does.
    failed = [r.resource for r in report.results if r.result in Result.FAILURES]
    but = f"; failed: {', '.join(failed)}" if failed else ""
    stream.write(f"Apply {verdict} in {report.seconds:.1f}s{gen}{but}.\n")
