"""`reconcile apply [FILE]`: where an apply starts. The spec, the generation held, or a saved plan is
applied through reconcile.apply.switching's one `switch` (lock, each Change between two re-probes, the
final plan, the switch judged and recorded as a generation); after a switch that does not serve, apply
goes back to the generation that was serving before it (exit 4, the reason in the report).
Called by the apply command.
"""

from __future__ import annotations

import time

from reconcile.apply import generations
from reconcile.apply.changes import ApplyReport, ProgressFn, plan_file_spec
from reconcile.apply.realization import who
from reconcile.apply.rollback import held_spec
from reconcile.apply.switching import Switch, switch, switch_to
from reconcile.errors import ReconcileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.loaded import LoadedSpec


def apply(
    loaded: LoadedSpec,
    *,
    lock_timeout: float,
    scheduled: bool = False,
    auto_rollback: bool = True,
    progress: ProgressFn | None = None,
    expected: dict[str, Any] | None = None,
    saved: bool = False,
) -> ApplyReport:
    """`reconcile apply`: the held generation or the spec, then, after a switch that does not serve,
    back to the generation that served before it (exit 4, the reason in the report). `expected`: the
    plan a person approved, or (`saved`) the plan saved by `plan --out`, run exactly."""
    state_dir = loaded.spec.machine.state_dir
    effective, notes, hold = held_spec(loaded, scheduled=scheduled)
    if saved and hold is not None:
        raise ReconcileError(
            f"{hold.describe()}: a saved plan of the spec is not applied while the hold stands "
            "(`reconcile resume` ends it, then make the plan again)"
        )
    held = None if hold is None else generations.read(state_dir, hold.generation)  # its config.json
    enabled = auto_rollback and getattr(effective.spec.server, "auto_rollback", True)
    outcome: dict[str, Any] = {}

    def after(sw: Switch, report: ApplyReport) -> None:
        """Under the lock: a retried spec that serves ends the failed hold; one that does not holds
        the generation that served before it, which is switched back to below."""
        if sw.problem is None:
            old = generations.read_hold(state_dir)
            if hold is None and old is not None and old.kind == "failed":
                generations.release_hold(state_dir)  # the retried spec serves now
            return
        target = _rollback_target(state_dir, sw.before, generations.current(state_dir))
        if enabled and hold is None and target is not None:
            generations.write_hold(
                state_dir,
                generations.Hold(
                    target["generation"], "failed", time.time(), who(), loaded.sha256, sw.problem
                ),
            )
            outcome["target"], outcome["problem"] = target, sw.problem
        elif not enabled:
            report.notes.append("automatic rollback is off: the failed generation stays")

    report = switch(
        Switch(loaded, effective, "apply FILE" if saved else "apply", held),
        lock_timeout=lock_timeout,
        progress=progress,
        after=after,
        scheduled=scheduled,
        # What a person approved at the terminal (the spec's plan; not a held generation's).
        expected=expected if effective is loaded else None,
        exact=saved,
    )
    report.notes[:0] = notes
    target = outcome.get("target")
    if target is not None:
        back = switch_to(
            loaded, target, lock_timeout, progress, reason=f"automatic rollback: {outcome['problem']}"
        )
        report.notes.append(
            f"automatic rollback to generation {target['generation']}: {outcome['problem']}; "
            + ("it serves again" if back.exit_code in (0, 2) else "it did NOT come back: see below")
        )
        report.results += [r._replace(resource=f"rollback:{r.resource}") for r in back.results]
        report.notes += back.notes
        report.generation = back.generation or target["generation"]
    return report


def apply_saved(path: str, *, lock_timeout: float, progress: ProgressFn | None = None) -> ApplyReport:
    """`reconcile apply FILE`: exactly the plan saved by `reconcile plan --out`, through the same
    switch (recorded, judged, rolled back when it does not serve)."""
    loaded, expected = plan_file_spec(path)
    return apply(loaded, lock_timeout=lock_timeout, progress=progress, expected=expected, saved=True)


def _rollback_target(state_dir: str, before: int | None, failed: int | None) -> dict[str, Any] | None:
    """The generation to go back to after a failed switch: the one that served before it; when none
    did (or it is the one that failed, or its record is gone), the last good one."""
    if before is not None and before != failed:
        try:
            return generations.read(state_dir, before)
        except ReconcileError:
            pass
    return generations.last_good(state_dir, other_than=failed)
