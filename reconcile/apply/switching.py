"""Switching generations: the spec an apply works on (the user's, or a held generation's), and under
the apply lock the realized state recorded, a switch judged (readiness, then the acceptance chat),
config.json restored; `rollback`.

Called by reconcile.apply.executor (apply) and the commands (rollback; plan/status/check for the
hold). Around reconcile.apply.changes, which runs the Changes.
"""

from __future__ import annotations

import os
import time

from reconcile.apply import bench_gate, generations
from reconcile.apply.changes import ApplyReport, ChangeResult, ProgressFn, apply_spec
from reconcile.apply.realization import generation_spec, realized_state, restore_config, seal_realization, who
from reconcile.errors import ReconcileError
from reconcile.plan.records import Action, Result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from reconcile.spec.loaded import LoadedSpec


def held_spec(
    loaded: LoadedSpec, *, scheduled: bool
) -> tuple[LoadedSpec, list[str], generations.Hold | None]:
    """The spec an apply works on: the user's, or the held generation's while the hold stands.
    Releases a hold whose spec content changed since it was made. Returns (spec, notes, hold)."""
    state_dir = loaded.spec.machine.state_dir
    hold = generations.read_hold(state_dir)
    if hold is None:
        return loaded, [], None
    if hold.from_spec != loaded.sha256:
        generations.release_hold(state_dir)
        return loaded, [f"the spec changed since it was {hold.describe()}: hold released"], None
    if hold.kind == "failed" and not scheduled:
        return loaded, [f"{hold.describe()}; this apply retries the spec that failed"], None
    try:
        held, notes = generation_spec(generations.read(state_dir, hold.generation), loaded)
    except ReconcileError as exc:
        raise ReconcileError(f"{hold.describe()}; but {exc} (`reconcile resume` ends the hold)") from None
    how = (
        "`reconcile resume` ends it"
        if hold.kind == "rollback"
        else "scheduled applies keep it until the spec changes; `reconcile apply` retries the spec"
    )
    return held, [f"{hold.describe()} ({how})", *notes], hold


def _server_result(report: ApplyReport) -> ChangeResult | None:
    """The result of the row whose action switches what serves (`Kind.serves`), if it ran."""
    from reconcile.resources import BY_NAME

    return next((r for r in report.results if BY_NAME[r.resource].serves), None)


def _judge(loaded: LoadedSpec, report: ApplyReport) -> tuple[bool, str | None]:
    """(whether this apply switched the server, why the switch failed: None when it serves). A
    switch must get ready, then pass the acceptance check (`reconcile check`'s chat, reasoning and
    forced tool call as the spec enables them)."""
    server = _server_result(report)
    if server is not None and server.result == Result.FAILED:
        return True, f"the server did not become ready: {server.message}"
    if server is None or server.result != Result.CHANGED or loaded.spec.server is None:
        return False, None
    if not loaded.spec.server.running:
        return False, None
    from probes.health import chat_check

    try:
        check = chat_check(loaded.spec)
    except Exception as exc:  # a check that cannot even ask has not passed
        return True, f"acceptance check failed: {type(exc).__name__}: {exc}"
    if check.ok:
        return True, None
    return True, "acceptance check failed: " + "; ".join(
        f"{s.name}: {s.message}" for s in check.steps if not s.ok
    )


def finish(original: LoadedSpec, applied: LoadedSpec, report: ApplyReport, *, reason: str) -> str | None:
    """Under the lock, at the end of an apply: record the state, judge a switch. Returns the problem.
    A record that cannot be written must not hide what the apply did: it becomes a note."""
    state_dir = applied.spec.machine.state_dir
    if report.refused is not None:
        return None
    if not report.changed and _server_result(report) is None and generations.current(state_dir) is not None:
        return None  # nothing switched: the current generation stands
    judged, problem = _judge(applied, report)
    try:
        number, new = generations.record(state_dir, realized_state(applied), reason=reason)
        report.generation = number if new else None
        problem = problem or bench_gate.after_switch(
            applied.spec, state_dir, number, judged=judged, reason=reason
        )
        if judged:
            generations.set_verdict(
                state_dir, number, problem is None, problem or "ready, acceptance check passed"
            )
        seal_realization(original, applied, report, problem is None)
    except (OSError, ReconcileError) as exc:
        report.notes.append(f"could not record the generation: {exc}")
    if problem is not None:
        report.results.append(
            ChangeResult("acceptance", Action.CHANGE, "the switch", Result.FAILED, problem, 0.0)
        )
    return problem


def switch_to(
    loaded: LoadedSpec, gen: dict[str, Any], lock_timeout: float, progress: ProgressFn | None, *, reason: str
) -> ApplyReport:
    """Apply generation `gen`'s spec at its realization, its config.json bytes put back first."""
    applied, notes = generation_spec(gen, loaded)

    def restore(report: ApplyReport) -> None:
        restore_config(applied, gen)

    def done(report: ApplyReport) -> None:
        finish(loaded, applied, report, reason=reason)

    report = apply_spec(
        applied,
        lock_timeout=lock_timeout,
        rollback_of=int(gen["generation"]),
        progress=progress,
        on_locked=restore,
        on_done=done,
    )
    report.notes[:0] = notes
    return report


def rollback(
    loaded: LoadedSpec,
    target: int | None,
    *,
    lock_timeout: float,
    progress: ProgressFn | None = None,
    approve: Callable[[LoadedSpec], object] | None = None,
) -> tuple[int, ApplyReport]:
    """`reconcile rollback [N]`: switch to generation N's realization (default: the one numbered below
    the current), restart once, and hold it until the spec changes or `reconcile resume`. `approve`
    (a terminal's question) sees generation N's spec first and raises to change nothing."""
    state_dir = loaded.spec.machine.state_dir
    have = [g["generation"] for g in generations.read_all(state_dir)]
    now = generations.current(state_dir)
    if target is None:
        below = [n for n in have if now is not None and n < now]
        if not below:
            raise ReconcileError(
                f"{generations.profile_dir(state_dir)}: no generation before {now or 'none'} to roll back to "
                f"(have {', '.join(map(str, have)) or 'none'})"
            )
        target = below[-1]
    gen = generations.read(state_dir, target)
    if approve is not None:
        approve(generation_spec(gen, loaded)[0])
    venv = (gen.get("venv") or {}).get("path")
    rebuilt = bool(venv) and not os.path.isdir(str(venv))
    previous = generations.read_hold(state_dir)
    # Held before the lock is taken: a timer apply that gets it first already keeps generation N.
    generations.write_hold(
        state_dir,
        generations.Hold(
            target, "rollback", time.time(), who(), loaded.sha256, f"reconcile rollback {target}"
        ),
    )
    try:
        report = switch_to(loaded, gen, lock_timeout, progress, reason=f"rollback to {target}")
    except BaseException:
        if previous is None:  # nothing switched: the hold as it was
            generations.release_hold(state_dir)
        else:
            generations.write_hold(state_dir, previous)
        raise
    if rebuilt:
        report.notes.append(f"{venv} had been removed (gc): it was built again")
    return target, report
